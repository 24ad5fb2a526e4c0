// quantforge batch JOBS.yaml [-o OUTDIR] [--shard I/N | --shards N] [--resume] [--dry-run] [--json]
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "batch/batch_plan.h"
#include "batch/job_record.h"
#include "batch/jobs_file.h"
#include "batch/run_batch.h"
#include "commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "flags.h"

namespace qf::cli {
namespace {

struct BatchOpts {
  std::string jobs, out, shard_text;
  std::optional<std::string> shard;  // nullopt: --shard not given (given empty is an error)
  int64_t shards = 0;
  int threads = 0;
  bool resume = false, dry_run = false, json = false;
};

std::string invocation(const BatchOpts& o) {
  std::string s = "quantforge batch " + o.jobs;
  if (!o.out.empty()) s += " -o " + o.out;
  if (o.shard) s += " --shard " + *o.shard;
  if (o.shards) s += " --shards " + std::to_string(o.shards);
  if (o.resume) s += " --resume";
  return s;
}

void print(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }

void run_batch_command(const BatchOpts& o) {
  namespace fs = std::filesystem;
  // A bad flag is a usage error before the jobs file is read.
  const batch::Shard shard = batch::choose_shard(o.shard, o.shards, [](const char* k) { return std::getenv(k); });
  const batch::JobsFile f = batch::parse_jobs_file(o.jobs);
  fs::path out = !o.out.empty() ? fs::path(o.out) : f.output;
  if (out.empty()) throw Error(ErrorKind::Usage, o.jobs + ": no output folder: give -o OUTDIR or `output:` in the jobs file");
  const std::vector<batch::Job> jobs = batch::plan_jobs(f, out);
  const bool quiet = Progress::quiet();
  auto log = [quiet](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "%s\n", s.c_str());
  };
  if (o.dry_run) {
    const std::vector<size_t> slice = batch::shard_slice(jobs, shard.index, shard.count);
    const nlohmann::ordered_json list = batch::dry_run(f, jobs, slice, out);
    if (o.json) return print(nlohmann::ordered_json{{"shard", {{"index", shard.index}, {"count", shard.count}}},
                                                    {"jobs", list}}.dump(2) + "\n");
    char line[512];
    std::snprintf(line, sizeof line, "%-40s %-9s %12s %12s %10s  %s\n", "job", "kind", "disk (est)", "memory (est)",
                  "time (est)", "state");
    print(line);
    double disk = 0, secs = 0;
    for (const auto& j : list) {
      const auto& e = j["estimate"];
      disk += e["disk_bytes"].get<double>();
      if (j["state"] != "done") secs += e["seconds"].get<double>();
      std::snprintf(line, sizeof line, "%-40s %-9s %8.1f MiB %8.1f MiB %10s  %s\n", j["id"].get<std::string>().c_str(),
                    j["kind"].get<std::string>().c_str(), e["disk_bytes"].get<double>() / 1048576.0,
                    e["memory_bytes"].get<double>() / 1048576.0,
                    Progress::format_duration(e["seconds"].get<double>()).c_str(), j["state"].get<std::string>().c_str());
      print(line);
    }
    std::snprintf(line, sizeof line, "%zu job(s) in shard %lld/%lld; outputs about %.1f MiB; %s of work left (estimated)\n",
                  list.size(), static_cast<long long>(shard.index), static_cast<long long>(shard.count),
                  disk / 1048576.0, Progress::format_duration(secs).c_str());
    print(line);
    return;
  }
  std::unique_ptr<ThreadPool> holder;
  ThreadPool& pool = pool_for(o.threads, holder);
  batch::BatchOptions bo;
  bo.out = out;
  bo.shard = shard;
  bo.resume = o.resume;
  bo.invocation = invocation(o);
  const batch::BatchOutcome r = batch::run_batch(f, jobs, bo, pool, log);
  if (!quiet) std::fprintf(stderr, "\n%s", batch::status_table(r.status).c_str());
  if (o.json) print(r.status.dump(2) + "\n");
  if (!quiet)
    std::fprintf(stderr, "this shard: %lld ran, %lld already done, %lld run elsewhere, %lld failed; status in %s\n",
                 static_cast<long long>(r.ran), static_cast<long long>(r.skipped), static_cast<long long>(r.elsewhere),
                 static_cast<long long>(r.failed), batch::status_path(out).c_str());
  if (r.failed) {
    std::string msg = std::to_string(r.failed) + " job(s) failed:";
    for (const std::string& s : r.failures) msg += " [" + s + "]";
    throw Error(static_cast<ErrorKind>(r.exit_code), batch::status_path(out).string() + ": " + msg);
  }
}

}  // namespace

void register_batch(CLI::App& app) {
  auto o = std::make_shared<BatchOpts>();
  CLI::App* cmd = app.add_subcommand("batch", "Run a jobs file: many models x GGUF presets and recipes, resumable, sharded over Slurm arrays or Kubernetes Indexed Jobs");
  cmd->add_option("jobs", o->jobs, "the jobs file (YAML; see docs/batch.md)")->required();
  cmd->add_option("-o,--output", o->out, "output folder (default: the jobs file's `output:`)");
  CLI::Option* shard = cmd->add_option("--shard", o->shard_text, "run the I-th of N disjoint slices of the jobs (I/N, from 0); default: from SLURM_ARRAY_TASK_ID/COUNT or JOB_COMPLETION_INDEX");
  cmd->add_option("--shards", o->shards, "the number of shards of a Kubernetes Indexed Job (its completions); the index comes from JOB_COMPLETION_INDEX")
      ->check(int_at_least(1));
  cmd->add_flag("--resume", o->resume, "continue interrupted quantize jobs from their last finished layer (finished jobs are always skipped)");
  cmd->add_flag("--dry-run", o->dry_run, "print the jobs of this shard, their estimated disk, memory and time, and what is done; run nothing");
  cmd->add_flag("--json", o->json, "print batch-status.json (or, with --dry-run, the job list) on stdout");
  add_threads_option(cmd, o->threads);
  cmd->callback([o, shard] {
    if (shard->count()) o->shard = o->shard_text;
    run_batch_command(*o);
  });
}

}  // namespace qf::cli
