// `quantforge batch`: runs this shard's slice of a job list, one job at a
// time (one model in memory at a time), skipping finished jobs, locking each
// job so that concurrent shards on a shared filesystem never run one twice,
// and recording every outcome (job_record.h). A failing job is recorded and
// the next one runs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "batch/batch_plan.h"
#include "batch/jobs_file.h"
#include "core/thread_pool.h"

namespace qf::batch {

struct BatchOptions {
  std::filesystem::path out;  // the output folder (created if missing)
  Shard shard;
  bool resume = false;        // interrupted quantize jobs go on from their last finished layer
  std::string invocation;     // the command, for the quantize reports
};

struct BatchOutcome {
  int64_t ran = 0, skipped = 0, failed = 0, elsewhere = 0;  // of this shard's jobs
  int exit_code = 0;  // 0, or the first failed job's (10 for a gate)
  nlohmann::ordered_json status;  // batch-status.json as written last
  std::vector<std::string> failures;  // "ID: message"
};

// Io error (one line naming both) when the output folder, or a model's
// output subfolder, is or lies inside a model's folder: the outputs would
// change the model's files and with them every job's fingerprint, so each
// run would redo every job. run_batch and dry_run check it first.
void check_outputs_outside_models(const JobsFile& f, const std::filesystem::path& out);

// log: lines for stderr (job starts with the ETA, notes, skips). On SIGINT,
// SIGTERM or SIGHUP (core/interrupt.h) the job being run is recorded as
// "interrupted" before the process ends.
BatchOutcome run_batch(const JobsFile& f, const std::vector<Job>& jobs, const BatchOptions& o, ThreadPool& pool,
                       const std::function<void(const std::string&)>& log);

// batch-status.json for the whole list from the records on disk (jobs without
// one are "pending"; a "running" record whose lock is free, its process
// killed, is "interrupted"). Written atomically under OUT/.batch/status.lock.
nlohmann::ordered_json write_status(const JobsFile& f, const std::vector<Job>& jobs, const std::filesystem::path& out);

// What --dry-run prints: per job of the slice, its output, estimates and
// state ("done", or why it would run).
nlohmann::ordered_json dry_run(const JobsFile& f, const std::vector<Job>& jobs, const std::vector<size_t>& slice,
                               const std::filesystem::path& out);

// The table for stderr: one line per job of the status.
std::string status_table(const nlohmann::ordered_json& status);

}  // namespace qf::batch
