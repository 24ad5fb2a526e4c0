#include "checkpoint/manifest.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "core/sha256.h"

namespace qf {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<ManifestEntry> compute_manifest(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw not_found(dir.string(), "no such folder");
  std::vector<ManifestEntry> out;
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end;
  if (ec) throw io_error(dir.string(), "cannot list: " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw io_error(dir.string(), "cannot list: " + ec.message());
    if (!it->is_regular_file()) continue;  // follows symlinks
    const std::string rel = it->path().lexically_relative(dir).generic_string();
    if (rel == kManifestFileName) continue;
    ManifestEntry e;
    e.path = rel;
    e.bytes = fs::file_size(it->path());
    e.sha256 = sha256_file_hex(it->path());
    out.push_back(std::move(e));
  }
  if (ec) throw io_error(dir.string(), "cannot list: " + ec.message());
  std::sort(out.begin(), out.end(), [](const ManifestEntry& a, const ManifestEntry& b) { return a.path < b.path; });
  return out;
}

void write_manifest(const fs::path& dir) {
  json files = json::array();
  for (const auto& e : compute_manifest(dir))
    files.push_back({{"path", e.path}, {"bytes", e.bytes}, {"sha256", e.sha256}});
  json m = {{"format", "quantforge-manifest"}, {"version", 1}, {"files", std::move(files)}};
  write_file_atomic(dir / kManifestFileName, m.dump(2) + "\n");
}

std::vector<std::string> verify_manifest(const fs::path& dir) {
  const fs::path mpath = dir / kManifestFileName;
  std::error_code ec;
  if (!fs::exists(mpath, ec)) throw not_found(mpath.string(), "no manifest");
  json m;
  try {
    m = json::parse(read_text_file(mpath));
  } catch (const json::exception& e) {
    throw invalid_input(mpath.string(), std::string("not valid JSON: ") + e.what());
  }
  if (!m.is_object() || m.value("format", "") != "quantforge-manifest" || !m.contains("files") || !m["files"].is_array())
    throw invalid_input(mpath.string(), "not a quantforge manifest");
  std::map<std::string, ManifestEntry> want;
  for (const auto& f : m["files"]) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("sha256") || !f["sha256"].is_string())
      throw invalid_input(mpath.string(), "malformed entry " + f.dump());
    ManifestEntry e{f["path"].get<std::string>(), f["bytes"].get<uint64_t>(), f["sha256"].get<std::string>()};
    want[e.path] = e;
  }
  std::vector<std::string> problems;
  std::map<std::string, ManifestEntry> have;
  for (auto& e : compute_manifest(dir)) have[e.path] = e;
  for (const auto& [p, e] : want) {
    auto it = have.find(p);
    if (it == have.end()) problems.push_back(p + ": missing");
    else if (it->second.bytes != e.bytes) problems.push_back(p + ": size " + std::to_string(it->second.bytes) + " differs from " + std::to_string(e.bytes));
    else if (it->second.sha256 != e.sha256) problems.push_back(p + ": sha256 differs");
  }
  for (const auto& [p, e] : have)
    if (!want.count(p)) problems.push_back(p + ": not in the manifest");
  std::sort(problems.begin(), problems.end());
  return problems;
}

}  // namespace qf
