// What a batch knows about each job between runs, on the output filesystem:
//
//   OUT/.batch/jobs/MODEL/TARGET.json   the job's record (below)
//   OUT/.batch/locks/MODEL/TARGET.lock  held while a process runs the job
//   OUT/batch-status.json               every job of the list with its record
//
// A job is finished when its record says "done", the record's fingerprint
// equals the job's fingerprint now (tool version, the model's files by size
// and modification time, the target: preset and imatrix, or the recipe's
// text and the calibration data by hash), and every output file is there
// with its recorded size. The gate has its own fingerprint, so a changed
// gate re-runs only the evaluation.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "batch/batch_plan.h"
#include "batch/jobs_file.h"

namespace qf::batch {

struct JobRecord {
  std::string id, kind, output;
  std::string status;  // "running", "interrupted" (by a signal), "done", "failed"
  std::string fingerprint, eval_fingerprint;
  std::string started, finished;  // UTC, ISO 8601
  double seconds = 0, produce_seconds = 0, eval_seconds = 0;
  uint64_t output_bytes = 0;
  std::vector<std::pair<std::string, uint64_t>> files;  // relative to the output's folder; "" for a single file
  nlohmann::ordered_json eval;  // the evaluation report (eval --json's keys) or null
  std::string error;            // the failure's message
  int exit_code = 0;            // what the CLI would have exited with for it
  std::string host, shard;
  int64_t pid = 0;
  bool resumed = false;         // continued an interrupted quantize

  nlohmann::ordered_json to_json() const;
  static JobRecord from_json(const nlohmann::ordered_json& j);
};

std::filesystem::path record_path(const std::filesystem::path& out_dir, const Job& job);
std::filesystem::path lock_path(const std::filesystem::path& out_dir, const Job& job);
inline std::filesystem::path status_path(const std::filesystem::path& out_dir) { return out_dir / "batch-status.json"; }

// nullopt when there is no record or it cannot be read (then it counts as
// never run).
std::optional<JobRecord> read_record(const std::filesystem::path& out_dir, const Job& job);
void write_record(const std::filesystem::path& out_dir, const Job& job, const JobRecord& r);

// The fingerprints (sha256 hex of a canonical JSON description).
std::string job_fingerprint(const JobsFile& f, const Job& job);
std::string eval_fingerprint(const Job& job);

// The regular files of an output (a file, or every file under a folder) with
// their sizes; empty when it does not exist.
std::vector<std::pair<std::string, uint64_t>> output_files(const std::filesystem::path& output);

// What is wrong with the output files a record lists ("" when every one is
// there with its recorded size): "its output is missing", "output file F is
// missing", "output file F changed size".
std::string output_problem(const JobRecord& r, const Job& job);

// Why the job is not finished ("" when it is): no record, failed, changed
// inputs, a missing or resized output file.
std::string not_done_reason(const std::optional<JobRecord>& r, const std::string& fingerprint,
                            const std::string& eval_fp, const Job& job);

// UTC now as "2026-11-24T05:59:49Z".
std::string utc_now();

}  // namespace qf::batch
