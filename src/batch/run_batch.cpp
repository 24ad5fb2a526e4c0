#include "batch/run_batch.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>

#include "batch/job_record.h"
#include "calibration/imatrix_collect.h"
#include "calibration/quantize_model.h"
#include "convert/hf_to_gguf.h"
#include "core/error.h"
#include "core/file_lock.h"
#include "core/interrupt.h"
#include "core/io.h"
#include "core/progress.h"
#include "core/sha256.h"
#include "core/temporaries.h"
#include "core/version.h"
#include "eval/eval_run.h"
#include "formats/hf/resolve.h"

namespace qf::batch {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / 1048576.0);
  return buf;
}

const char* kind_of(const TargetSpec& t) { return t.kind == TargetSpec::Kind::Gguf ? "gguf" : "quantize"; }

uint64_t free_bytes(const fs::path& dir) {
  struct statvfs s = {};
  if (::statvfs(dir.c_str(), &s) != 0) return UINT64_MAX;  // unknown: do not refuse
  return static_cast<uint64_t>(s.f_bavail) * static_cast<uint64_t>(s.f_frsize);
}

// The imatrix a GGUF target computes from a text: one file per model and
// settings, shared by the targets (and shards) that ask for the same.
fs::path ensure_imatrix(const JobsFile& f, const Job& job, const fs::path& out, ThreadPool& pool,
                        const std::function<void(const std::string&)>& log) {
  const ModelSpec& m = f.models[job.model];
  const ImatrixSpec& im = *f.targets[job.target].imatrix;
  const ResolvedModel rm = resolve_model(m.arg, m.revision);
  // Named by what it depends on: the model's files, the text and the settings.
  const json key = {{"tool", version()}, {"model", model_file_stats(rm.dir)}, {"text", sha256_file_hex(im.text)}, {"chunks", im.chunks}, {"ctx", im.ctx}};
  const std::string h = sha256_hex(key.dump()).substr(0, 12);
  const fs::path path = out / m.name / ("imatrix-" + h + ".gguf");
  fs::create_directories(out / ".batch" / "locks" / m.name);
  const FileLock lock = FileLock::acquire(out / ".batch" / "locks" / m.name / ("imatrix-" + h + ".lock"));
  if (fs::is_regular_file(path)) {
    log("  imatrix: " + path.string() + " (computed before)");
    return path;
  }
  ImatrixOptions io;
  io.ctx = im.ctx;
  io.max_chunks = im.chunks;
  io.dataset = im.text.filename().string();
  LazyProgress bar("  imatrix", "chunks");
  write_imatrix_from_text(rm.dir.string(), im.text, path, "imatrix", io, false, false, pool, std::ref(bar));
  bar.finish();
  log("  imatrix: wrote " + path.string());
  return path;
}

// Produces the job's output (nothing is under its final name until it is complete).
void produce(const JobsFile& f, const Job& job, const BatchOptions& o, ThreadPool& pool,
             const std::function<void(const std::string&)>& log, JobRecord& r) {
  const ModelSpec& m = f.models[job.model];
  const TargetSpec& t = f.targets[job.target];
  const ResolvedModel rm = resolve_model(m.arg, m.revision);
  fs::create_directories(job.output.parent_path());
  if (t.kind == TargetSpec::Kind::Gguf) {
    GgufConvertOptions g;
    g.preset = t.preset;
    if (t.imatrix) g.imatrix = t.imatrix->file.empty() ? ensure_imatrix(f, job, o.out, pool, log) : t.imatrix->file;
    g.note = [&](const std::string& s) { log("  note: " + s); };
    if (fs::exists(job.output)) fs::remove(job.output);  // outdated: its inputs changed
    convert_hf_to_gguf(rm.dir, job.output, g, pool);
  } else {
    // An outdated output is replaced; an interrupted run's state (beside
    // it) is used only with --resume and the same inputs.
    if (fs::exists(job.output)) fs::remove_all(job.output);
    QuantizeJob q;
    q.model = rm.dir.string();
    q.recipe = t.recipe;
    q.out = job.output;
    q.calib = job.calib;
    q.resume = o.resume;
    q.invocation = o.invocation + "  # job " + job.id;
    LazyProgress bar("  " + job.id, "layers");
    q.on_layer = std::ref(bar);
    quantize_model(q, pool, [&](const std::string& line) {
      if (line.rfind("layer ", 0) == 0) return;  // the bar shows the layers
      if (line.rfind("resuming", 0) == 0) r.resumed = true;
      log("  " + line);
    });
    bar.finish();
  }
}

void evaluate(const Job& job, const JobsFile& f, ThreadPool& pool, const std::function<void(const std::string&)>& log,
              JobRecord& r) {
  const EvalSpec& e = *job.eval;
  const ModelSpec& m = f.models[job.model];
  eval::EvalRequest req;
  req.model = job.output.string();
  req.text = e.text.string();
  req.baseline = resolve_model(m.arg, m.revision).dir.string();
  req.ppl.max_spans = e.chunks;
  req.ppl.ctx = e.ctx;
  req.gate.max_ppl_ratio = e.max_ppl_ratio;
  req.gate.max_ppl_delta = e.max_ppl_delta;
  req.gate.max_kld = e.max_kld;
  LazyProgress bar("  eval", "chunks");
  const eval::EvalRun run = eval::run_eval(req, pool, std::ref(bar));
  bar.finish();
  r.eval = run.report;
  // Without bounds nothing fails, as with `eval`; an invalid measurement is
  // still said loudly (and recorded: "valid": false, "problems").
  if (run.failures.empty())
    for (const std::string& p : eval::measurement_problems(run.result)) log("  warning: the evaluation is not valid: " + p);
  if (!run.failures.empty()) {
    std::string msg = job.output.string() + ": the gate failed:";
    for (size_t i = 0; i < run.failures.size(); ++i) msg += (i ? "; " : " ") + run.failures[i];
    throw Error(ErrorKind::GateFailed, msg);
  }
}

// A fresh record of a job this process runs now.
JobRecord new_record(const JobsFile& f, const Job& job, const std::string& shard) {
  JobRecord r;
  r.id = job.id;
  r.kind = kind_of(f.targets[job.target]);
  r.output = job.output.string();
  r.started = utc_now();
  r.host = temp_host_tag();
  r.pid = ::getpid();
  r.shard = shard;
  return r;
}

// Where the records and batch-status.json are written from: the loop, and
// the interrupt hook, which on SIGINT/SIGTERM/SIGHUP records the job this
// process runs as "interrupted" (and rewrites the status) before the process
// ends, instead of leaving a "running" that nobody will finish. One mutex
// orders the two, and nothing the loop writes after the hook is kept.
class RecordWriter {
 public:
  RecordWriter(const JobsFile& f, const std::vector<Job>& jobs, const fs::path& out) : f_(f), jobs_(jobs), out_(out) {}

  // Writes the job's record and the status. A "running" record becomes the
  // one the hook finishes; any other clears it.
  json write(const Job& job, const JobRecord& r) {
    std::lock_guard<std::mutex> lock(mu_);
    if (interrupted_) return last_;
    write_record(out_, job, r);
    if (r.status == "running") {
      job_ = &job, running_ = r, t0_ = std::chrono::steady_clock::now();
    } else {
      job_ = nullptr;
    }
    return last_ = write_status(f_, jobs_, out_);
  }

  // The status rewritten from the records (the last one written once
  // interrupted: the process is ending and may no longer write files).
  json status() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!interrupted_) last_ = write_status(f_, jobs_, out_);
    return last_;
  }

  void on_interrupt() {
    std::lock_guard<std::mutex> lock(mu_);
    interrupted_ = true;
    if (!job_) return;
    running_.status = "interrupted";
    running_.finished = utc_now();
    running_.seconds = seconds_since(t0_);
    running_.error = "interrupted by a signal (SIGINT, SIGTERM or SIGHUP)";
    write_record(out_, *job_, running_);
    last_ = write_status(f_, jobs_, out_);
  }

 private:
  const JobsFile& f_;
  const std::vector<Job>& jobs_;
  const fs::path out_;
  std::mutex mu_;
  bool interrupted_ = false;
  const Job* job_ = nullptr;
  JobRecord running_;
  std::chrono::steady_clock::time_point t0_;
  json last_ = {{"jobs", json::array()}};
};

}  // namespace

void check_outputs_outside_models(const JobsFile& f, const fs::path& out) {
  for (size_t i = 0; i < f.models.size(); ++i) {
    const ModelSpec& m = f.models[i];
    const fs::path dir = resolve_model(m.arg, m.revision).dir;
    // OUT holds the batch's records and status, OUT/NAME each model's outputs.
    std::vector<fs::path> written = {out};
    for (const ModelSpec& n : f.models) written.push_back(out / n.name);
    for (const fs::path& w : written)
      if (is_within(w, dir))
        throw io_error(out.string(), "the batch would write " + w.string() + (same_entry(w, dir) ? ", which is" : ", inside") +
                                         " the model folder " + dir.string() + " (" + m.where +
                                         "); its outputs would change the model's files, so every run would redo "
                                         "every job: choose an output folder outside the models");
  }
}

json write_status(const JobsFile& f, const std::vector<Job>& jobs, const fs::path& out) {
  fs::create_directories(out / ".batch");
  const FileLock lock = FileLock::acquire(out / ".batch" / "status.lock");
  json list = json::array();
  std::map<std::string, int64_t> counts;
  for (const Job& job : jobs) {
    const TargetSpec& t = f.targets[job.target];
    const std::optional<JobRecord> r = read_record(out, job);
    json e;
    if (r) {
      e = r->to_json();
      if (r->status == "running") {
        fs::create_directories(lock_path(out, job).parent_path());
        if (FileLock::try_acquire(lock_path(out, job))) e["status"] = "interrupted";
      }
    } else {
      e = {{"id", job.id}, {"kind", kind_of(t)}, {"output", job.output.string()}, {"status", "pending"}};
    }
    e["model"] = f.models[job.model].name;
    e["target"] = t.name;
    counts[e["status"].get<std::string>()]++;
    list.push_back(e);
  }
  json summary = {{"jobs", static_cast<int64_t>(jobs.size())}};
  for (const char* k : {"done", "failed", "running", "interrupted", "pending"}) summary[k] = counts[k];
  json s = {{"format", "quantforge-batch-status"}, {"version", 1}, {"jobs_file", fs::absolute(f.path).lexically_normal().string()},
            {"updated", utc_now()}, {"summary", summary}, {"jobs", list}};
  write_file_atomic(status_path(out), s.dump(2) + "\n");
  return s;
}

json dry_run(const JobsFile& f, const std::vector<Job>& jobs, const std::vector<size_t>& slice, const fs::path& out) {
  check_outputs_outside_models(f, out);
  json list = json::array();
  for (size_t i : slice) {
    const Job& job = jobs[i];
    const std::string reason = not_done_reason(read_record(out, job), job_fingerprint(f, job), eval_fingerprint(job), job);
    const Estimate& e = job.estimate;
    list.push_back({{"id", job.id},
                    {"kind", kind_of(f.targets[job.target])},
                    {"output", job.output.string()},
                    {"state", reason.empty() ? "done" : "to run (" + reason + ")"},
                    {"estimate", {{"parameters", e.parameters}, {"disk_bytes", e.disk_bytes},
                                  {"memory_bytes", e.memory_bytes}, {"seconds", e.seconds}}}});
  }
  return list;
}

std::string status_table(const json& status) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "%-12s %-40s %9s %12s %10s %10s  %s\n", "status", "job", "seconds", "size", "ppl", "kld", "error");
  s += line;
  for (const json& j : status.at("jobs")) {
    const json ev = j.value("eval", json());
    char ppl[32] = "-", kld[32] = "-", secs[32] = "-", size[32] = "-";
    // A measured number that was not finite is null in the report.
    auto cell = [&](char* buf, size_t n, const char* fmt, std::initializer_list<const char*> keys) {
      if (!ev.is_object() || !ev.contains(*keys.begin())) return;
      const std::optional<double> v = eval::report_number(ev, keys);
      if (v) std::snprintf(buf, n, fmt, *v);
      else std::snprintf(buf, n, "%s", "invalid");
    };
    cell(ppl, sizeof ppl, "%.4f", {"ppl"});
    cell(kld, sizeof kld, "%.5f", {"kld", "mean"});
    if (const std::optional<double> v = eval::report_number(j, {"seconds"})) std::snprintf(secs, sizeof secs, "%.1f", *v);
    if (const std::optional<double> v = eval::report_number(j, {"output_bytes"}); v && *v > 0)
      std::snprintf(size, sizeof size, "%s", mib(static_cast<uint64_t>(*v)).c_str());
    auto text = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string("?"); };
    const std::string err = j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>() : "";
    std::snprintf(line, sizeof line, "%-12s %-40s %9s %12s %10s %10s  %s\n", text("status").c_str(), text("id").c_str(),
                  secs, size, ppl, kld, err.c_str());
    s += line;
  }
  return s;
}

BatchOutcome run_batch(const JobsFile& f, const std::vector<Job>& jobs, const BatchOptions& o, ThreadPool& pool,
                       const std::function<void(const std::string&)>& log) {
  check_outputs_outside_models(f, o.out);
  fs::create_directories(o.out / ".batch");
  const std::vector<size_t> slice = shard_slice(jobs, o.shard.index, o.shard.count);
  RecordWriter records(f, jobs, o.out);
  const InterruptHook on_interrupt([&records] { records.on_interrupt(); });
  BatchOutcome res;
  {
    std::string head = "batch: " + std::to_string(jobs.size()) + " job(s) in " + f.path.string();
    if (o.shard.count > 1 || !o.shard.source.empty())
      head += "; shard " + std::to_string(o.shard.index) + "/" + std::to_string(o.shard.count) +
              (o.shard.source.empty() ? "" : " (" + o.shard.source + ")");
    log(head + " runs " + std::to_string(slice.size()));
  }
  double est_left = 0, est_done = 0, real_done = 0;
  for (size_t i : slice) est_left += jobs[i].estimate.seconds;
  const std::string shard_name = std::to_string(o.shard.index) + "/" + std::to_string(o.shard.count);
  int64_t k = 0;
  for (size_t idx : slice) {
    ++k;
    const Job& job = jobs[idx];
    const std::string tag = "[" + std::to_string(k) + "/" + std::to_string(slice.size()) + "] " + job.id;
    est_left -= job.estimate.seconds;
    std::string fp, efp, reason;
    std::optional<JobRecord> prev;
    try {
      fp = job_fingerprint(f, job);
      efp = eval_fingerprint(job);
      prev = read_record(o.out, job);
      reason = not_done_reason(prev, fp, efp, job);
    } catch (const Error& e) {
      reason = "?";
      fp.clear();
      JobRecord r = new_record(f, job, shard_name);
      r.status = "failed";
      r.error = e.what(), r.exit_code = exit_code(e.kind()), r.finished = r.started;
      records.write(job, r);
      res.failed++;
      res.failures.push_back(job.id + ": " + e.what());
      if (!res.exit_code) res.exit_code = r.exit_code;
      log(tag + ": failed: " + e.what());
      continue;
    }
    if (reason.empty()) {
      res.skipped++;
      log(tag + ": done before, skipped");
      continue;
    }
    fs::create_directories(lock_path(o.out, job).parent_path());
    std::string holder;
    std::optional<FileLock> lock = FileLock::try_acquire(lock_path(o.out, job), &holder);
    if (!lock) {
      res.elsewhere++;
      log(tag + ": another process runs it (" + holder + "), skipped");
      continue;
    }
    prev = read_record(o.out, job);  // it may have finished meanwhile
    reason = not_done_reason(prev, fp, efp, job);
    if (reason.empty()) {
      res.skipped++;
      log(tag + ": done meanwhile, skipped");
      continue;
    }
    const double ratio = est_done > 0 ? real_done / est_done : 1.0;
    log(tag + ": " + kind_of(f.targets[job.target]) + " -> " + job.output.string() + " (" + reason +
        "); estimated " + Progress::format_duration(job.estimate.seconds * ratio) + ", then " +
        Progress::format_duration(est_left * ratio) + " for the rest of this shard");
    JobRecord r = new_record(f, job, shard_name);
    r.status = "running";
    r.fingerprint = fp;
    r.eval_fingerprint = efp;
    records.write(job, r);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const bool reuse = prev && prev->fingerprint == fp && output_problem(*prev, job).empty();
      if (reuse) {
        log("  the output is up to date; evaluating only");
        r.files = prev->files;
        r.produce_seconds = prev->produce_seconds;
      } else {
        const uint64_t need = job.estimate.disk_bytes + f.reserve_disk;
        const uint64_t have = free_bytes(o.out);
        if (have < need)
          throw io_error(o.out.string(), "not enough free disk for job " + job.id + ": about " + mib(need) +
                                             " needed (estimate" + (f.reserve_disk ? " + reserve_disk" : "") + "), " +
                                             mib(have) + " free");
        // Only what this batch wrote is ever replaced.
        if (!prev && fs::exists(job.output))
          throw io_error(job.output.string(), "exists but was not written by this batch (no record in " +
                                                  (o.out / ".batch").string() + "); move it away or choose another -o");
        const auto tp = std::chrono::steady_clock::now();
        produce(f, job, o, pool, log, r);
        r.produce_seconds = seconds_since(tp);
        r.files = output_files(job.output);
      }
      r.output_bytes = 0;
      for (const auto& fl : r.files) r.output_bytes += fl.second;
      if (job.eval) {
        const auto te = std::chrono::steady_clock::now();
        try {
          evaluate(job, f, pool, log, r);
        } catch (...) {
          r.eval_seconds = seconds_since(te);
          throw;
        }
        r.eval_seconds = seconds_since(te);
      }
      r.status = "done";
      res.ran++;
    } catch (const Error& e) {
      if (interrupted()) throw;
      r.status = "failed";
      r.error = e.what();
      r.exit_code = exit_code(e.kind());
    } catch (const std::filesystem::filesystem_error& e) {
      if (interrupted()) throw;
      r.status = "failed";
      r.error = e.path1().string() + ": " + e.code().message();
      r.exit_code = exit_code(ErrorKind::Io);
    } catch (const std::bad_alloc&) {
      r.status = "failed";
      r.error = "out of memory";
      r.exit_code = exit_code(ErrorKind::Io);
    }
    r.seconds = seconds_since(t0);
    r.finished = utc_now();
    res.status = records.write(job, r);
    est_done += job.estimate.seconds;
    real_done += r.seconds;
    if (r.status == "failed") {
      res.failed++;
      res.failures.push_back(job.id + ": " + r.error);
      if (!res.exit_code) res.exit_code = r.exit_code;
      log(tag + ": failed: " + r.error);
    } else {
      char line[160];
      std::snprintf(line, sizeof line, ": done in %.1f s, %s", r.seconds, mib(r.output_bytes).c_str());
      log(tag + line);
    }
  }
  res.status = records.status();
  return res;
}

}  // namespace qf::batch
