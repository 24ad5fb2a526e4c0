#include "batch/batch_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "batch/jobs_file.h"
#include "core/error.h"
#include "test_util.h"

namespace qf::batch {
namespace {

using test::source_dir;
using test::TempDir;
using test::write_file;

std::vector<Job> jobs_with_costs(const std::vector<double>& costs) {
  std::vector<Job> jobs;
  for (size_t i = 0; i < costs.size(); ++i) {
    Job j;
    j.id = "m/t" + std::to_string(i);
    j.estimate.seconds = costs[i];
    jobs.push_back(j);
  }
  return jobs;
}

TEST(BatchShards, SlicesAreDisjointCompleteBalancedAndDeterministic) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0.1, 100.0);
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = 1 + rng() % 40;
    std::vector<double> costs(n);
    for (double& c : costs) c = cost(rng);
    if (trial % 5 == 0) std::fill(costs.begin(), costs.end(), 3.0);  // ties
    const std::vector<Job> jobs = jobs_with_costs(costs);
    for (int64_t count = 1; count <= 7; ++count) {
      std::vector<int> owner(n, -1);
      std::vector<double> load(static_cast<size_t>(count), 0.0);
      for (int64_t s = 0; s < count; ++s) {
        const std::vector<size_t> slice = shard_slice(jobs, s, count);
        EXPECT_EQ(slice, shard_slice(jobs, s, count)) << "not deterministic";
        EXPECT_TRUE(std::is_sorted(slice.begin(), slice.end())) << "slices run in job order";
        for (size_t j : slice) {
          ASSERT_LT(j, n);
          EXPECT_EQ(owner[j], -1) << "job " << j << " is in two shards";
          owner[j] = static_cast<int>(s);
          load[static_cast<size_t>(s)] += costs[j];
        }
      }
      for (size_t j = 0; j < n; ++j) EXPECT_GE(owner[j], 0) << "job " << j << " is in no shard";
      // Greedy largest-first: no shard exceeds another by more than the
      // largest job, unless it holds a single job.
      const double most = *std::max_element(costs.begin(), costs.end());
      const double hi = *std::max_element(load.begin(), load.end());
      const double lo = *std::min_element(load.begin(), load.end());
      if (n >= static_cast<size_t>(count)) {
        EXPECT_LE(hi - lo, most + 1e-9) << "n " << n << " count " << count;
      }
    }
  }
}

TEST(BatchShards, TheShardComesFromTheFlagSlurmOrKubernetes) {
  std::map<std::string, std::string> env;
  auto get = [&](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  Shard s = choose_shard(std::nullopt, 0, get);
  EXPECT_EQ(s.index, 0);
  EXPECT_EQ(s.count, 1);
  EXPECT_EQ(s.source, "");

  env = {{"SLURM_ARRAY_TASK_ID", "2"}, {"SLURM_ARRAY_TASK_COUNT", "4"}};
  s = choose_shard(std::nullopt, 0, get);
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.source, "slurm");
  // --array=10-20:5 -> tasks 10, 15, 20
  env = {{"SLURM_ARRAY_TASK_ID", "15"}, {"SLURM_ARRAY_TASK_COUNT", "3"}, {"SLURM_ARRAY_TASK_MIN", "10"},
         {"SLURM_ARRAY_TASK_STEP", "5"}};
  s = choose_shard(std::nullopt, 0, get);
  EXPECT_EQ(s.index, 1);
  EXPECT_EQ(s.count, 3);
  env["SLURM_ARRAY_TASK_ID"] = "12";
  EXPECT_THROW(choose_shard(std::nullopt, 0, get), Error);
  // The flag wins over the environment.
  s = choose_shard("0/2", 0, get);
  EXPECT_EQ(s.index, 0);
  EXPECT_EQ(s.count, 2);
  EXPECT_EQ(s.source, "--shard");
  env = {{"SLURM_ARRAY_TASK_ID", "1"}};
  EXPECT_THROW(choose_shard(std::nullopt, 0, get), Error) << "no task count";

  env = {{"JOB_COMPLETION_INDEX", "3"}};
  EXPECT_THROW(choose_shard(std::nullopt, 0, get), Error) << "Kubernetes needs --shards";
  s = choose_shard(std::nullopt, 5, get);
  EXPECT_EQ(s.index, 3);
  EXPECT_EQ(s.count, 5);
  EXPECT_EQ(s.source, "kubernetes");
  EXPECT_THROW(choose_shard(std::nullopt, 3, get), Error) << "index 3 of 3";
  env.clear();
  EXPECT_THROW(choose_shard(std::nullopt, 3, get), Error) << "--shards without an index";
  for (const char* bad : {"1", "1/0", "2/2", "-1/2", "a/b", "1/2/3", "/2"}) EXPECT_THROW(choose_shard(bad, 0, get), Error) << bad;
  // Given but empty (--shard "") is not "not given"; an explicit slice with
  // --shards (which it would ignore) is refused.
  EXPECT_QF_ERROR(choose_shard(std::string(), 0, get), ErrorKind::Usage, "--shard: expected I/N");
  EXPECT_QF_ERROR(choose_shard("1/2", 5, get), ErrorKind::Usage, "do not go together");
  EXPECT_EQ(choose_shard("1/2", 0, get).index, 1);
}

TEST(BatchJobs, CrossProductNarrowedPerModelWithMergedGatesAndCalibration) {
  TempDir dir;
  const std::string d = (source_dir() / "tests" / "data").string();
  write_file(dir.path() / "jobs.yaml",
             "models:\n"
             "  - path: " + d + "/fixture-llama\n"
             "    name: a\n"
             "    exclude: [fp8]\n"
             "    eval: {max_kld: 0.2}\n"
             "  - path: " + d + "/fixture-llama\n"
             "    name: b\n"
             "    targets: [fp8, Q8_0]\n"
             "    calib: " + d + "/text/evaluation.txt\n"
             "targets:\n"
             "  - gguf: q8_0\n"
             "  - gguf: Q4_K_M\n"
             "    eval: false\n"
             "  - recipe: " + d + "/recipes/fp8.yaml\n"
             "    calib: " + d + "/text/calibration.txt\n"
             "    eval: {max_ppl_ratio: 1.5, chunks: 3}\n"
             "eval:\n"
             "  text: " + d + "/text/evaluation.txt\n"
             "  chunks: 2\n"
             "  max_kld: 0.5\n");
  const JobsFile f = parse_jobs_file(dir.path() / "jobs.yaml");
  const std::vector<Job> jobs = plan_jobs(f, "/out");
  std::vector<std::string> ids;
  for (const Job& j : jobs) ids.push_back(j.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"a/Q8_0", "a/Q4_K_M", "b/Q8_0", "b/fp8"}));
  EXPECT_EQ(jobs[0].output, std::filesystem::path("/out/a/Q8_0.gguf"));
  EXPECT_EQ(jobs[3].output, std::filesystem::path("/out/b/fp8"));
  // a/Q8_0: the file's gate with the model's max_kld.
  ASSERT_TRUE(jobs[0].eval);
  EXPECT_EQ(jobs[0].eval->chunks, 2);
  EXPECT_DOUBLE_EQ(*jobs[0].eval->max_kld, 0.2);
  EXPECT_FALSE(jobs[0].eval->max_ppl_ratio);
  EXPECT_FALSE(jobs[1].eval) << "eval: false";
  // b/fp8: the target's chunks and ratio over the file's; the model's calibration over the target's.
  ASSERT_TRUE(jobs[3].eval);
  EXPECT_EQ(jobs[3].eval->chunks, 3);
  EXPECT_DOUBLE_EQ(*jobs[3].eval->max_ppl_ratio, 1.5);
  EXPECT_DOUBLE_EQ(*jobs[3].eval->max_kld, 0.5);
  EXPECT_EQ(jobs[3].calib.filename(), "evaluation.txt");
  for (const Job& j : jobs) {
    EXPECT_GT(j.estimate.parameters, 0u);
    EXPECT_GT(j.estimate.disk_bytes, 0u);
    EXPECT_GT(j.estimate.memory_bytes, j.estimate.model_bytes);
    EXPECT_GT(j.estimate.seconds, 0);
  }
  // Q8_0 is about twice Q4_K_M's size.
  EXPECT_GT(jobs[0].estimate.disk_bytes, jobs[1].estimate.disk_bytes * 3 / 2);
}

}  // namespace
}  // namespace qf::batch
