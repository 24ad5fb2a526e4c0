#include "batch/job_record.h"

#include <algorithm>
#include <ctime>

#include "core/error.h"
#include "core/io.h"
#include "core/sha256.h"
#include "core/version.h"
#include "eval/eval_run.h"
#include "formats/hf/resolve.h"

namespace qf::batch {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

json file_hash(const fs::path& p) { return {{"sha256", sha256_file_hex(p)}}; }

}  // namespace

json JobRecord::to_json() const {
  json fl = json::array();
  for (const auto& [p, n] : files) fl.push_back({{"path", p}, {"bytes", n}});
  return {{"id", id},
          {"kind", kind},
          {"output", output},
          {"status", status},
          {"fingerprint", fingerprint},
          {"eval_fingerprint", eval_fingerprint},
          {"started", started},
          {"finished", finished},
          {"seconds", seconds},
          {"produce_seconds", produce_seconds},
          {"eval_seconds", eval_seconds},
          {"output_bytes", output_bytes},
          {"files", fl},
          {"eval", eval},
          {"error", error.empty() ? json() : json(error)},
          {"exit_code", exit_code},
          {"host", host},
          {"pid", pid},
          {"shard", shard},
          {"resumed", resumed}};
}

JobRecord JobRecord::from_json(const json& j) {
  JobRecord r;
  r.id = j.at("id").get<std::string>();
  r.kind = j.at("kind").get<std::string>();
  r.output = j.at("output").get<std::string>();
  r.status = j.at("status").get<std::string>();
  r.fingerprint = j.at("fingerprint").get<std::string>();
  r.eval_fingerprint = j.at("eval_fingerprint").get<std::string>();
  r.started = j.value("started", "");
  r.finished = j.value("finished", "");
  // eval::report_number: null (a NaN or an infinity when written) and a
  // missing key read as no number.
  auto number = [&j](const char* key) { return eval::report_number(j, {key}).value_or(0.0); };
  r.seconds = number("seconds");
  r.produce_seconds = number("produce_seconds");
  r.eval_seconds = number("eval_seconds");
  r.output_bytes = static_cast<uint64_t>(number("output_bytes"));
  for (const json& f : j.at("files")) r.files.emplace_back(f.at("path").get<std::string>(), f.at("bytes").get<uint64_t>());
  r.eval = j.value("eval", json());
  r.error = j.at("error").is_null() ? "" : j.at("error").get<std::string>();
  r.exit_code = static_cast<int>(number("exit_code"));
  r.host = j.value("host", "");
  r.pid = static_cast<int64_t>(number("pid"));
  r.shard = j.value("shard", "");
  r.resumed = j.value("resumed", false);
  return r;
}

fs::path record_path(const fs::path& out_dir, const Job& job) {
  return out_dir / ".batch" / "jobs" / (job.id + ".json");
}

fs::path lock_path(const fs::path& out_dir, const Job& job) {
  return out_dir / ".batch" / "locks" / (job.id + ".lock");
}

std::optional<JobRecord> read_record(const fs::path& out_dir, const Job& job) {
  const fs::path p = record_path(out_dir, job);
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  try {
    return JobRecord::from_json(json::parse(read_text_file(p)));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void write_record(const fs::path& out_dir, const Job& job, const JobRecord& r) {
  const fs::path p = record_path(out_dir, job);
  fs::create_directories(p.parent_path());
  write_file_atomic(p, r.to_json().dump(2) + "\n");
}

std::string job_fingerprint(const JobsFile& f, const Job& job) {
  const ModelSpec& m = f.models[job.model];
  const TargetSpec& t = f.targets[job.target];
  const ResolvedModel rm = resolve_model(m.arg, m.revision);
  json d;
  d["tool"] = version();
  d["model"] = model_file_stats(rm.dir);
  if (t.kind == TargetSpec::Kind::Gguf) {
    d["gguf"] = t.preset;
    if (t.imatrix) {
      if (!t.imatrix->file.empty()) d["imatrix"] = file_hash(t.imatrix->file);
      else d["imatrix"] = {{"text", file_hash(t.imatrix->text)}, {"chunks", t.imatrix->chunks}, {"ctx", t.imatrix->ctx}};
    }
  } else {
    d["recipe"] = {{"path", fs::absolute(t.recipe).lexically_normal().string()}, {"text", read_text_file(t.recipe)}};
    if (!job.calib.empty()) d["calib"] = file_hash(job.calib);
  }
  return sha256_hex(d.dump());
}

std::string eval_fingerprint(const Job& job) {
  if (!job.eval) return "none";
  const EvalSpec& e = *job.eval;
  json d = {{"text", file_hash(e.text)}, {"chunks", e.chunks}, {"ctx", e.ctx}};
  d["max_ppl_ratio"] = e.max_ppl_ratio ? json(*e.max_ppl_ratio) : json();
  d["max_ppl_delta"] = e.max_ppl_delta ? json(*e.max_ppl_delta) : json();
  d["max_kld"] = e.max_kld ? json(*e.max_kld) : json();
  return sha256_hex(d.dump());
}

std::vector<std::pair<std::string, uint64_t>> output_files(const fs::path& output) {
  std::vector<std::pair<std::string, uint64_t>> out;
  std::error_code ec;
  if (fs::is_regular_file(output, ec)) {
    out.emplace_back("", fs::file_size(output));
  } else if (fs::is_directory(output, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(output))
      if (e.is_regular_file()) out.emplace_back(fs::relative(e.path(), output).generic_string(), e.file_size());
    std::sort(out.begin(), out.end());
  }
  return out;
}

std::string not_done_reason(const std::optional<JobRecord>& r, const std::string& fingerprint, const std::string& eval_fp,
                            const Job& job) {
  if (!r) return "never run";
  if (r->status == "running" || r->status == "interrupted") return "interrupted";
  if (r->status != "done") return "failed before";
  if (r->fingerprint != fingerprint) return "its inputs changed";
  if (r->eval_fingerprint != eval_fp) return "its gate changed";
  return output_problem(*r, job);
}

std::string output_problem(const JobRecord& r, const Job& job) {
  if (r.files.empty()) return "its output is missing";
  std::error_code ec;
  for (const auto& [p, n] : r.files) {
    const fs::path f = p.empty() ? job.output : job.output / p;
    if (!fs::is_regular_file(f, ec)) return "output file " + f.string() + " is missing";
    if (fs::file_size(f, ec) != n) return "output file " + f.string() + " changed size";
  }
  return "";
}

std::string utc_now() {
  char when[32] = "";
  const std::time_t now = std::time(nullptr);
  struct tm t = {};
  if (gmtime_r(&now, &t)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &t);
  return when;
}

}  // namespace qf::batch
