// Fuzz target: the jobs file of `quantforge batch`. The input is written as
// jobs.yaml beside a fixed set of things it may name (a model folder with a
// small llama config.json, texts, a recipe, and a Hugging Face cache with one
// repo, org/tiny), then parsed and validated, planned into jobs with their
// estimates and gates, sliced into shards, and checked for outputs inside a
// model folder. Nothing is run: no model is loaded and nothing is written.
#include <cstdlib>

#include "batch/batch_plan.h"
#include "batch/jobs_file.h"
#include "batch/run_batch.h"
#include "fuzz_util.h"

namespace {

namespace fs = std::filesystem;

constexpr const char* kConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
 "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "vocab_size": 256,
 "tie_word_embeddings": false, "torch_dtype": "float16"})";

constexpr const char* kRecipe = R"(quant_stage:
  quant_modifiers:
    GPTQModifier:
      targets: [Linear]
      ignore: [lm_head]
      scheme: W4A16
calibration:
  dataset: calib.txt
  num_samples: 4
  seq_len: 64
)";

// The folder the jobs files live in, with what they may refer to.
const fs::path& jobs_dir() {
  static const fs::path dir = [] {
    const fs::path d = qf::fuzz::scratch_dir() / "batch_jobs";
    qf::fuzz::write_file("batch_jobs/model/config.json", kConfig);
    qf::fuzz::write_file("batch_jobs/eval.txt", "Once upon a time there was a small model.\n");
    qf::fuzz::write_file("batch_jobs/calib.txt", "Some calibration text.\n");
    qf::fuzz::write_file("batch_jobs/recipe.yaml", kRecipe);
    qf::fuzz::write_file("batch_jobs/hub/models--org--tiny/snapshots/abc123/config.json", kConfig);
    qf::fuzz::write_file("batch_jobs/hub/models--org--tiny/refs/main", "abc123");
    // `hf:` and `glob:` read this cache only, never the machine's.
    setenv("HF_HUB_CACHE", (d / "hub").c_str(), 1);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path dir = jobs_dir();
  const fs::path path = qf::fuzz::write_file("batch_jobs/jobs.yaml", data, size);
  qf::fuzz::run([&] {
    const qf::batch::JobsFile f = qf::batch::parse_jobs_file(path);
    const fs::path out = f.output.empty() ? dir / "out" : f.output;
    const std::vector<qf::batch::Job> jobs = qf::batch::plan_jobs(f, out);
    for (const qf::batch::Job& j : jobs) {
      if (!(j.estimate.seconds >= 0)) qf::fuzz::fail("job " + j.id + " has a negative or NaN time estimate");
      if ((j.output.parent_path().parent_path() / "").lexically_normal() != (out / "").lexically_normal())
        qf::fuzz::fail("job " + j.id + " writes outside its model's folder of OUT");
    }
    // The slices of any shard count are disjoint and cover the list.
    for (int64_t count : {1, 3}) {
      std::vector<int> seen(jobs.size(), 0);
      for (int64_t i = 0; i < count; ++i)
        for (size_t k : qf::batch::shard_slice(jobs, i, count)) seen[k]++;
      for (int n : seen)
        if (n != 1) qf::fuzz::fail("the shards of " + std::to_string(count) + " do not partition the jobs");
    }
    qf::batch::check_outputs_outside_models(f, out);
  });
  return 0;
}
