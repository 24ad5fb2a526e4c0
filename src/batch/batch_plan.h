// The job list of a batch: the cross product of a jobs file's models and
// targets (narrowed per model), each with its output path, effective gate
// and calibration, and an estimate of its cost; and the slicing of that list
// over the shards of a scheduler (Slurm job arrays, Kubernetes Indexed Jobs).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "batch/jobs_file.h"

namespace qf::batch {

struct Estimate {
  uint64_t parameters = 0;    // of the source model
  uint64_t model_bytes = 0;   // its weight files
  uint64_t disk_bytes = 0;    // the output (an upper estimate)
  uint64_t memory_bytes = 0;  // peak resident memory of the job
  double seconds = 0;         // on 2 cores; for balancing shards and the ETA
};

struct Job {
  std::string id;  // MODEL/TARGET
  size_t model = 0, target = 0;     // indices into JobsFile::models / targets
  std::filesystem::path output;     // OUT/MODEL/TARGET (a folder) or OUT/MODEL/TARGET.gguf
  std::filesystem::path calib;      // recipe targets: the calibration override (the model's, else the target's)
  std::optional<EvalSpec> eval;     // the effective gate; empty: no evaluation
  Estimate estimate;
};

// The jobs in file order (models outer, targets inner). InvalidInput at the
// model's or target's position when a gate has bounds but no text.
std::vector<Job> plan_jobs(const JobsFile& f, const std::filesystem::path& out_dir);

// The estimate of one job (reads the model's config.json and file sizes).
Estimate estimate_job(const JobsFile& f, const Job& job);

// Which shard this process is. The sources, first found wins: --shard I/N
// (`shard_flag`: nullopt when not given; given empty is a usage error, and so
// is giving it with --shards, which would be ignored); SLURM_ARRAY_TASK_ID
// with SLURM_ARRAY_TASK_COUNT (and SLURM_ARRAY_TASK_MIN /
// SLURM_ARRAY_TASK_STEP when the array does not start at 0 or steps);
// JOB_COMPLETION_INDEX with `shards` (a Kubernetes Indexed Job's
// completions, from --shards; 0: not given). No source: the one shard 0/1.
struct Shard {
  int64_t index = 0, count = 1;
  std::string source;  // "--shard", "slurm", "kubernetes", "" (none)
};
Shard choose_shard(const std::optional<std::string>& shard_flag, int64_t shards_flag,
                   const std::function<const char*(const char*)>& getenv);

// Indices of the jobs shard `index` of `count` runs, in job order. Jobs are
// dealt out by estimated cost, largest first, each to the shard with the
// least total so far (ties: lower shard, then job order), so that the slices
// are disjoint, cover the list, are balanced and depend on nothing but the
// list.
std::vector<size_t> shard_slice(const std::vector<Job>& jobs, int64_t index, int64_t count);

}  // namespace qf::batch
