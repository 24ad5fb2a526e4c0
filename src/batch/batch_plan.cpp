#include "batch/batch_plan.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "core/error.h"
#include "formats/hf/model_config.h"
#include "formats/hf/resolve.h"
#include "quantizers/gguf_mix.h"
#include "quantizers/kquants.h"
#include "recipe/recipe.h"

namespace qf::batch {

namespace fs = std::filesystem;

namespace {

// The effective gate: the file's, then the target's, then the model's keys.
std::optional<EvalSpec> merged_eval(const JobsFile& f, const ModelSpec& m, const TargetSpec& t) {
  if (t.no_eval) return std::nullopt;
  std::optional<EvalSpec> out = f.eval;
  for (const std::optional<EvalSpec>* o : {&t.eval, &m.eval}) {
    if (!*o) continue;
    const EvalSpec& s = **o;
    if (!out) out = EvalSpec{};
    if (!s.text.empty()) out->text = s.text;
    if (s.chunks) out->chunks = s.chunks;
    if (s.ctx) out->ctx = s.ctx;
    if (s.max_ppl_ratio) out->max_ppl_ratio = s.max_ppl_ratio;
    if (s.max_ppl_delta) out->max_ppl_delta = s.max_ppl_delta;
    if (s.max_kld) out->max_kld = s.max_kld;
  }
  return out;
}

uint64_t weight_file_bytes(const fs::path& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string ext = e.path().extension().string();
    if (ext == ".safetensors" || ext == ".bin") n += fs::file_size(e.path(), ec);
  }
  return n;
}

}  // namespace

std::vector<Job> plan_jobs(const JobsFile& f, const fs::path& out_dir) {
  std::vector<Job> jobs;
  for (size_t mi = 0; mi < f.models.size(); ++mi) {
    const ModelSpec& m = f.models[mi];
    for (size_t ti = 0; ti < f.targets.size(); ++ti) {
      const TargetSpec& t = f.targets[ti];
      if (!m.only.empty() && std::find(m.only.begin(), m.only.end(), t.name) == m.only.end()) continue;
      if (std::find(m.exclude.begin(), m.exclude.end(), t.name) != m.exclude.end()) continue;
      Job j;
      j.id = m.name + "/" + t.name;
      j.model = mi;
      j.target = ti;
      j.output = out_dir / m.name / (t.kind == TargetSpec::Kind::Gguf ? t.name + ".gguf" : t.name);
      if (t.kind == TargetSpec::Kind::Recipe) j.calib = !m.calib.empty() ? m.calib : t.calib;
      j.eval = merged_eval(f, m, t);
      if (j.eval && j.eval->text.empty())
        throw invalid_input(m.where, "the gate of job " + j.id + " has no evaluation text (eval.text)");
      j.estimate = estimate_job(f, j);
      jobs.push_back(std::move(j));
    }
  }
  return jobs;
}

Estimate estimate_job(const JobsFile& f, const Job& job) {
  const ModelSpec& m = f.models[job.model];
  const TargetSpec& t = f.targets[job.target];
  const ResolvedModel rm = resolve_model(m.arg, m.revision);
  const ModelConfig c = load_model_config(rm.dir);
  Estimate e;
  const double h = static_cast<double>(c.hidden_size), ffn = static_cast<double>(c.intermediate_size);
  const double qd = static_cast<double>(c.q_dim()), kvd = static_cast<double>(c.kv_dim());
  const double layers = static_cast<double>(c.num_hidden_layers);
  const double layer_linear = h * (qd + 2 * kvd) + qd * h + 3 * h * ffn;
  const double linear = layers * layer_linear;
  const double embed = static_cast<double>(c.vocab_size) * h * (c.tie_word_embeddings ? 1 : 2);
  const double params = linear + embed;
  e.parameters = static_cast<uint64_t>(params);
  e.model_bytes = weight_file_bytes(rm.dir);
  const double src_bytes_per_param = params > 0 ? static_cast<double>(e.model_bytes) / params : 2.0;
  if (t.kind == TargetSpec::Kind::Gguf) {
    const gguf_mix::Preset& p = gguf_mix::parse_preset(t.preset);
    // The preset's base type; some tensors get more bits (output, attn_v),
    // hence the margin.
    const double bpw = 8.0 * static_cast<double>(kquants::row_size(p.base_type, 256)) / 256.0;
    e.disk_bytes = static_cast<uint64_t>(params * std::max(bpw, 4.5) / 8.0 * 1.15) + (1u << 20);
    e.memory_bytes = e.model_bytes + static_cast<uint64_t>(4 * std::max(embed / 2, h * ffn) * 2);
    const bool kquant = p.name.find("_K") != std::string::npos;
    e.seconds = params / (kquant ? 17.5e6 : 100e6);  // measured on 2 cores: TinyLlama Q4_K_M in ~63 s
    if (t.imatrix && !t.imatrix->text.empty()) {
      const double tokens = static_cast<double>(t.imatrix->chunks ? t.imatrix->chunks : 64) * static_cast<double>(t.imatrix->ctx);
      e.seconds += 2 * params * tokens / 20e9;
    }
  } else {
    const Recipe r = parse_recipe_file(t.recipe);
    int bits = 0;
    int64_t group = 0;
    bool calibrated = false;
    for (const ModifierSpec& mod : r.modifiers) {
      if (mod.kind != "QuantizationModifier") calibrated = true;
      for (const auto& g : mod.groups) {
        if (g.input_activations && !g.input_activations->dynamic) calibrated = true;
        if (!g.quantize_weights) continue;
        bits = std::max(bits, g.weights.bits);
        if (g.weights.grouped()) group = group ? std::min(group, g.weights.group_size) : g.weights.group_size;
      }
    }
    if (bits == 0) bits = 16;
    const double scale_bits = group > 0 ? 16.0 / static_cast<double>(group) : 0.0;
    e.disk_bytes = static_cast<uint64_t>((linear * (bits + scale_bits) / 8.0 + embed * src_bytes_per_param) * 1.05) + (1u << 20);
    const double tokens = calibrated ? static_cast<double>(r.calibration.num_samples * r.calibration.seq_len) : 0.0;
    const double hess = (2 * h * h + qd * qd + ffn * ffn) * 8;
    e.memory_bytes = e.model_bytes + static_cast<uint64_t>(tokens * h * 4 + hess + layer_linear * 4 * 2);
    e.seconds = params / 30e6;
    if (calibrated) {
      e.seconds += 2 * 2 * linear * tokens / 20e9;  // capture and write-back passes
      const double solve = layers * (qd * h * h + 2 * kvd * h * h + h * qd * qd + 2 * ffn * h * h + h * ffn * ffn) * 2;
      e.seconds += solve / 20e9;
    }
  }
  if (job.eval) {
    const double tokens = static_cast<double>(job.eval->chunks ? job.eval->chunks : 64) * 512.0;
    e.seconds += 2 * 2 * params * tokens / 20e9;  // the output and the baseline
  }
  return e;
}

Shard choose_shard(const std::optional<std::string>& shard_flag, int64_t shards_flag,
                   const std::function<const char*(const char*)>& getenv) {
  auto number = [](const std::string& s, const std::string& what) -> int64_t {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0 || v < 0)
      throw Error(ErrorKind::Usage, what + ": expected a non-negative integer, got '" + s + "'");
    return v;
  };
  Shard s;
  if (shard_flag) {
    const std::string& flag = *shard_flag;
    const size_t slash = flag.find('/');
    if (slash == std::string::npos) throw Error(ErrorKind::Usage, "--shard: expected I/N (e.g. 0/4), got '" + flag + "'");
    // --shards only names the count of a Kubernetes Indexed Job; with an
    // explicit slice it would be ignored, and a mismatch go unnoticed.
    if (shards_flag > 0)
      throw Error(ErrorKind::Usage, "--shard " + flag + " and --shards " + std::to_string(shards_flag) +
                                        " do not go together: --shard I/N names the slice, --shards N is for JOB_COMPLETION_INDEX");
    s.index = number(flag.substr(0, slash), "--shard");
    s.count = number(flag.substr(slash + 1), "--shard");
    s.source = "--shard";
  } else if (const char* id = getenv("SLURM_ARRAY_TASK_ID"); id && *id) {
    const char* count = getenv("SLURM_ARRAY_TASK_COUNT");
    if (!count || !*count) throw Error(ErrorKind::Usage, "SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not");
    const char* min = getenv("SLURM_ARRAY_TASK_MIN");
    const char* step = getenv("SLURM_ARRAY_TASK_STEP");
    const int64_t lo = min && *min ? number(min, "SLURM_ARRAY_TASK_MIN") : 0;
    const int64_t st = step && *step ? number(step, "SLURM_ARRAY_TASK_STEP") : 1;
    const int64_t task = number(id, "SLURM_ARRAY_TASK_ID");
    if (st < 1 || task < lo || (task - lo) % st != 0)
      throw Error(ErrorKind::Usage, std::string("SLURM_ARRAY_TASK_ID ") + id + " is not on the array's grid (min " +
                                        std::to_string(lo) + ", step " + std::to_string(st) + ")");
    s.index = (task - lo) / st;
    s.count = number(count, "SLURM_ARRAY_TASK_COUNT");
    s.source = "slurm";
  } else if (const char* k = getenv("JOB_COMPLETION_INDEX"); k && *k) {
    if (shards_flag <= 0)
      throw Error(ErrorKind::Usage, "JOB_COMPLETION_INDEX is set (a Kubernetes Indexed Job): give --shards N, the Job's completions");
    s.index = number(k, "JOB_COMPLETION_INDEX");
    s.count = shards_flag;
    s.source = "kubernetes";
  } else if (shards_flag > 0) {
    throw Error(ErrorKind::Usage, "--shards N needs JOB_COMPLETION_INDEX (a Kubernetes Indexed Job); use --shard I/N otherwise");
  }
  if (s.count < 1 || s.index >= s.count)
    throw Error(ErrorKind::Usage, "shard " + std::to_string(s.index) + " of " + std::to_string(s.count) +
                                      " does not exist (the index counts from 0 and must be below the count)");
  return s;
}

std::vector<size_t> shard_slice(const std::vector<Job>& jobs, int64_t index, int64_t count) {
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return jobs[a].estimate.seconds > jobs[b].estimate.seconds; });
  std::vector<double> load(static_cast<size_t>(count), 0.0);
  std::vector<size_t> mine;
  for (size_t j : order) {
    const size_t s = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[s] += std::max(jobs[j].estimate.seconds, 1e-3);
    if (static_cast<int64_t>(s) == index) mine.push_back(j);
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

}  // namespace qf::batch
