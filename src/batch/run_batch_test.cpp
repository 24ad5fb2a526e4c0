// run_batch on hostile inputs: an evaluation whose perplexity is infinite
// (its numbers are null in every record, the job fails by its gate on every
// run, nothing reading the records crashes), records holding nulls, and
// output folders that would change a model's own files.
#include "batch/run_batch.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "batch/job_record.h"
#include "core/error.h"
#include "core/io.h"
#include "eval/eval_run.h"
#include "modified_model.h"
#include "test_util.h"

namespace qf::batch {
namespace {

using namespace qf::test;
namespace fs = std::filesystem;

const fs::path kFixture = source_dir() / "tests/data/fixture-llama";

// A jobs file with one model and one Q8_0 target, gated on one short chunk.
JobsFile jobs_file(const TempDir& t, const fs::path& model) {
  const std::string all = read_text_file(source_dir() / "tests/data/text/evaluation.txt");
  write_file(t / "eval.txt", all.substr(0, 4000));
  write_file(t / "jobs.yaml", "models:\n  - path: " + model.string() +
                                  "\ntargets:\n  - gguf: Q8_0\neval:\n  text: eval.txt\n  chunks: 1\n  ctx: 64\n  max_kld: 0.5\n");
  return parse_jobs_file(t / "jobs.yaml");
}

BatchOutcome run(const JobsFile& f, const fs::path& out, std::string* log_text) {
  BatchOptions o;
  o.out = out;
  return run_batch(f, plan_jobs(f, out), o, ThreadPool::global(), [&](const std::string& s) { *log_text += s + "\n"; });
}

TEST(BatchRun, AnInfinitePerplexityFailsTheJobByItsGateOnEveryRun) {
  TempDir t;
  // Finite weights whose logits are so far apart that the perplexity overflows.
  copy_model_changing(kFixture, t / "big-head", "lm_head.weight", [](std::vector<float>& v) {
    float m = 0;
    for (float x : v) m = std::max(m, std::fabs(x));
    for (float& x : v) x *= 6e4f / m;
  });
  const JobsFile f = jobs_file(t, t / "big-head");
  for (int pass = 0; pass < 2; ++pass) {
    std::string log;
    const BatchOutcome r = run(f, t / "out", &log);
    EXPECT_EQ(r.failed, 1) << log;
    EXPECT_EQ(r.exit_code, exit_code(ErrorKind::GateFailed)) << log;
    ASSERT_EQ(r.failures.size(), 1u);
    EXPECT_NE(r.failures[0].find("the perplexity is infinite"), std::string::npos) << r.failures[0];
    if (pass == 1) {
      EXPECT_NE(log.find("evaluating only"), std::string::npos) << log;
    }
    // The status as read back from disk: the job failed with exit 10 and a
    // null perplexity, and the table shows it instead of throwing.
    const nlohmann::ordered_json status = nlohmann::ordered_json::parse(read_text_file(status_path(t / "out")));
    const nlohmann::ordered_json& job = status["jobs"][0];
    EXPECT_EQ(job["status"], "failed");
    EXPECT_EQ(job["exit_code"], 10);
    EXPECT_TRUE(job["eval"]["ppl"].is_null()) << job["eval"].dump();
    EXPECT_FALSE(job["eval"]["valid"].get<bool>());
    std::string table;
    EXPECT_NO_THROW(table = status_table(status));
    EXPECT_NE(table.find("invalid"), std::string::npos) << table;
  }
}

TEST(BatchRecords, NullNumbersReadBack) {
  TempDir t;
  const JobsFile f = jobs_file(t, kFixture);
  const std::vector<Job> jobs = plan_jobs(f, t / "out");
  JobRecord r;
  r.id = jobs[0].id, r.kind = "gguf", r.output = jobs[0].output.string(), r.status = "failed";
  r.fingerprint = "f", r.eval_fingerprint = "e";
  r.seconds = std::nan("");
  r.eval = {{"ppl", std::numeric_limits<double>::infinity()}, {"kld", {{"mean", std::nan("")}}}, {"valid", false}};
  write_record(t / "out", jobs[0], r);
  // Written as nulls (JSON has no NaN); read back, not dropped as unreadable.
  const std::optional<JobRecord> back = read_record(t / "out", jobs[0]);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->seconds, 0.0);
  EXPECT_TRUE(back->eval["ppl"].is_null());
  EXPECT_EQ(back->status, "failed");
  const nlohmann::ordered_json status = write_status(f, jobs, t / "out");
  std::string table;
  EXPECT_NO_THROW(table = status_table(nlohmann::ordered_json::parse(status.dump())));
  EXPECT_NE(table.find("invalid"), std::string::npos) << table;
}

TEST(BatchRecords, AnInterruptedRecordIsNotDone) {
  TempDir t;
  const JobsFile f = jobs_file(t, kFixture);
  const std::vector<Job> jobs = plan_jobs(f, t / "out");
  JobRecord r;
  r.status = "interrupted";
  EXPECT_EQ(not_done_reason(r, "f", "e", jobs[0]), "interrupted");
}

TEST(BatchRun, RefusesOutputsInsideAModelFolder) {
  TempDir t;
  fs::copy(kFixture, t / "model");
  const JobsFile f = jobs_file(t, t / "model");
  // OUT inside the model, OUT the model itself, and OUT whose subfolder for
  // the model (named after its folder) is the model.
  for (const fs::path& out : {t / "model" / "out", t / "model", t.path()}) {
    EXPECT_QF_ERROR(check_outputs_outside_models(f, out), ErrorKind::Io, "the model folder");
    std::string log;
    EXPECT_QF_ERROR(run(f, out, &log), ErrorKind::Io, (t / "model").string());
    EXPECT_QF_ERROR(dry_run(f, plan_jobs(f, out), {0}, out), ErrorKind::Io, "the model folder");
  }
  EXPECT_FALSE(fs::exists(t / "model" / "out"));
  EXPECT_FALSE(fs::exists(t / "model" / ".batch"));
  EXPECT_FALSE(fs::exists(t / ".batch"));
  // Beside the model is fine.
  EXPECT_NO_THROW(check_outputs_outside_models(f, t / "out"));
}

}  // namespace
}  // namespace qf::batch
