#include "formats/hf/resolve.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "core/io.h"

namespace qf {

namespace fs = std::filesystem;

nlohmann::ordered_json model_file_stats(const fs::path& dir) {
  std::vector<fs::path> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (fs::is_regular_file(e.path())) names.push_back(e.path());
  std::sort(names.begin(), names.end());
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const fs::path& p : names)
    files.push_back({{"name", p.filename().string()},
                     {"bytes", fs::file_size(p)},
                     {"mtime", static_cast<int64_t>(fs::last_write_time(p).time_since_epoch().count())}});
  return files;
}

fs::path hf_hub_cache_dir() {
  if (const char* c = std::getenv("HF_HUB_CACHE"); c && *c) return c;
  if (const char* h = std::getenv("HF_HOME"); h && *h) return fs::path(h) / "hub";
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/") / ".cache" / "huggingface" / "hub";
}

namespace {

bool is_cache_repo(const fs::path& p) {
  return is_folder(p / "snapshots") && p.filename().string().rfind("models--", 0) == 0;
}

std::string repo_id_of(const fs::path& repo) {
  // models--ORG--NAME -> ORG/NAME (names may contain '-', never "--")
  std::string s = repo.filename().string().substr(8);
  auto pos = s.find("--");
  return pos == std::string::npos ? s : s.substr(0, pos) + "/" + s.substr(pos + 2);
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

ResolvedModel from_cache_repo(const fs::path& repo, const std::string& revision) {
  ResolvedModel m;
  m.kind = "hf-cache";
  m.repo_id = repo_id_of(repo);
  m.revision = revision;
  fs::path snaps = repo / "snapshots";
  fs::path ref = repo / "refs" / revision;
  if (is_file(ref)) {
    m.commit = trim(read_text_file(ref));
    if (m.commit.empty() || m.commit.find('/') != std::string::npos)
      throw invalid_input(ref.string(), "ref file does not hold a commit hash");
  } else if (is_folder(snaps / revision)) {
    m.commit = revision;  // a commit hash given directly
  } else {
    std::vector<std::string> all;
    for (const auto& e : fs::directory_iterator(snaps))
      if (e.is_directory()) all.push_back(e.path().filename().string());
    std::sort(all.begin(), all.end());
    if (all.size() != 1 || revision != "main") {
      std::string list;
      for (const auto& s : all) list += (list.empty() ? "" : ", ") + s;
      throw not_found(repo.string(), "no ref '" + revision + "' and " +
                                         (all.empty() ? std::string("no snapshots") : "snapshots: " + list) +
                                         "; pass a revision that names one");
    }
    m.commit = all[0];
  }
  m.dir = snaps / m.commit;
  if (!is_folder(m.dir))
    throw not_found(m.dir.string(), "ref '" + revision + "' points at commit " + m.commit + " but that snapshot is absent");
  return m;
}

}  // namespace

std::vector<std::string> cached_repo_ids() {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(hf_hub_cache_dir(), ec))
    if (is_cache_repo(e.path())) ids.push_back(repo_id_of(e.path()));
  std::sort(ids.begin(), ids.end());
  return ids;
}

ResolvedModel resolve_model(const std::string& arg, const std::string& revision) {
  fs::path p(arg);
  if (path_exists(p)) {
    if (!is_folder(p)) throw invalid_input(arg, "expected a model folder");
    if (is_cache_repo(p)) return from_cache_repo(p, revision);
    ResolvedModel m;
    m.dir = p;
    m.kind = "folder";
    // A snapshot folder inside the cache: report where it came from.
    fs::path parent = fs::absolute(p).lexically_normal();
    if (parent.filename().empty()) parent = parent.parent_path();
    if (parent.parent_path().filename() == "snapshots" && is_cache_repo(parent.parent_path().parent_path())) {
      m.kind = "hf-cache";
      m.repo_id = repo_id_of(parent.parent_path().parent_path());
      m.commit = parent.filename().string();
      m.revision = m.commit;
    }
    return m;
  }
  // ORG/NAME repo id in the local cache.
  auto slash = arg.find('/');
  if (slash != std::string::npos && slash > 0 && arg.find('/', slash + 1) == std::string::npos && arg[0] != '.') {
    fs::path repo = hf_hub_cache_dir() / ("models--" + arg.substr(0, slash) + "--" + arg.substr(slash + 1));
    if (is_cache_repo(repo)) return from_cache_repo(repo, revision);
    throw not_found(arg, "no such folder, and no Hugging Face cache entry at " + repo.string() +
                             " (nothing is downloaded; fetch the model first)");
  }
  throw not_found(arg, "no such model folder");
}

std::filesystem::path model_input_path(const std::string& model) {
  if (model.empty()) return {};
  std::error_code ec;
  if (std::filesystem::is_regular_file(model, ec)) return model;
  try {
    return resolve_model(model).dir;
  } catch (const Error&) {
    return {};
  }
}

}  // namespace qf
