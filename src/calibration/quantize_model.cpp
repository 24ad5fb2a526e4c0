#include "calibration/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "calibration/calibration_data.h"
#include "calibration/sequential.h"
#include "core/error.h"
#include "eval/bench.h"
#include "core/io.h"
#include "formats/export/compressed_tensors.h"
#include "formats/export/gptq_format.h"
#include "formats/export/manifest.h"
#include "formats/hf/model_config.h"
#include "formats/hf/resolve.h"
#include "formats/safetensors.h"
#include "formats/tokenizer/tokenizer.h"
#include "quantizers/gptq.h"
#include "quantizers/rtn.h"
#include "recipe/recipe.h"
#include "runtime/model.h"

namespace qf {
namespace {

DType model_dtype(const ModelConfig& c) {
  if (c.torch_dtype == "bfloat16") return DType::BF16;
  if (c.torch_dtype == "float32") return DType::F32;
  return DType::F16;
}

GptqOptions::ActOrder actorder_of(const std::string& a) {
  if (a == "group") return GptqOptions::ActOrder::Group;
  if (a == "weight") return GptqOptions::ActOrder::Weight;
  if (a == "static") return GptqOptions::ActOrder::Static;
  return GptqOptions::ActOrder::None;
}

const char* kCopiedFiles[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                              "generation_config.json", "vocab.json", "merges.txt", "added_tokens.json",
                              "chat_template.jinja"};

}  // namespace

QuantizeSummary quantize_model(const QuantizeJob& job, ThreadPool& pool, const std::function<void(const std::string&)>& log) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  const Recipe recipe = parse_recipe_file(job.recipe);
  if (recipe.modifiers.size() != 1)
    throw unsupported(recipe.source, "this version runs exactly one quantization modifier (GPTQModifier or "
                                     "QuantizationModifier); the recipe has " + std::to_string(recipe.modifiers.size()));
  const ModifierSpec& mod = recipe.modifiers.front();
  const bool gptq = mod.kind == "GPTQModifier";
  if (!gptq && mod.kind != "QuantizationModifier")
    throw unsupported(mod.where, mod.kind + " is not supported yet (GPTQModifier, QuantizationModifier)");
  const std::string format = recipe.export_.format;
  if (format != "compressed-tensors" && format != "gptq")
    throw unsupported(recipe.source, "export format '" + format + "' (compressed-tensors or gptq)");

  const ResolvedModel rm = resolve_model(job.model);
  const ModelConfig cfg = load_model_config(rm.dir);
  if (cfg.quantization_config)
    throw unsupported(rm.dir.string(), "the model is already quantized (config.json has a quantization_config); start from f16/bf16/f32 weights");
  std::unique_ptr<rt::Model> model = rt::load_hf_model(rm.dir);
  std::unique_ptr<Tokenizer> tok = load_tokenizer(rm.dir);
  const DType sdt = model_dtype(cfg);

  // Which scheme each Linear gets, checked before any work.
  struct Plan {
    ModifierSpec::Group group;
  };
  std::map<std::string, Plan> plan;
  std::set<std::string> group_names;
  const char* names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
  for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) {
    const rt::LayerWeights& L = model->weights().layers[static_cast<size_t>(li)];
    const std::shared_ptr<rt::Linear>* lins[] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
    for (int i = 0; i < 7; ++i) {
      const std::string name = "model.layers." + std::to_string(li) + "." + names[i];
      std::optional<ModifierSpec::Group> g = scheme_for(mod, name);
      if (!g || !g->quantize_weights) continue;
      if (!g->scale_dtype_set) g->weights.scale_dtype = sdt;
      const int64_t cols = (*lins[i])->in_features();
      if (g->weights.strategy == QuantStrategy::Group && cols % g->weights.group_size != 0)
        throw invalid_input(g->where, "group_size " + std::to_string(g->weights.group_size) + " does not divide the " +
                                          std::to_string(cols) + " input columns of " + name +
                                          " (choose a group size that divides it, use strategy: channel, or ignore the module)");
      if (format == "gptq") {
        if (g->weights.strategy == QuantStrategy::Tensor)
          throw unsupported(g->where, "the GPTQ format has no per-tensor strategy; use group or channel");
        if (!g->weights.symmetric)
          throw unsupported(g->where, "asymmetric GPTQ checkpoints (v1 zero-minus-one convention) cannot hold a zero point "
                                      "of 0; use symmetric: true or export compressed-tensors");
        if (g->scale_dtype_set && g->weights.scale_dtype != DType::F16)
          throw unsupported(g->where, "the GPTQ format stores f16 scales");
        g->weights.scale_dtype = DType::F16;
        const int64_t rows = (*lins[i])->out_features(), b = g->weights.bits;
        if (b != 2 && b != 3 && b != 4 && b != 8)
          throw unsupported(g->where, "the GPTQ format holds 2, 3, 4 or 8 bits, not " + std::to_string(b));
        if ((cols * b) % 32 != 0 || (rows * b) % 32 != 0)
          throw unsupported(g->where, name + " is [" + std::to_string(rows) + ", " + std::to_string(cols) +
                                          "]: GPTQ packing needs in*bits and out*bits to be multiples of 32");
      }
      plan[name] = {*g};
      group_names.insert(g->name);
    }
  }
  if (plan.empty()) throw invalid_input(recipe.source, "no Linear of the model matches the recipe's targets");
  if (format == "gptq" && static_cast<int64_t>(plan.size()) != 7 * cfg.num_hidden_layers)
    throw unsupported(recipe.source, "the GPTQ format expects every decoder Linear quantized; the recipe leaves " +
                                         std::to_string(7 * cfg.num_hidden_layers - static_cast<int64_t>(plan.size())) +
                                         " in full precision (export compressed-tensors, which records them in ignore)");
  if (format == "gptq" && group_names.size() > 1)
    throw unsupported(recipe.source, "the GPTQ format holds one scheme per model; export compressed-tensors for mixed schemes");

  std::vector<std::vector<int32_t>> samples;
  if (gptq) {
    // A relative calibration.dataset is relative to the recipe file.
    fs::path calib = job.calib;
    if (calib.empty() && !recipe.calibration.dataset.empty()) {
      calib = recipe.calibration.dataset;
      if (calib.is_relative()) calib = job.recipe.parent_path() / calib;
    }
    if (calib.empty())
      throw Error(ErrorKind::Usage, "GPTQ needs calibration data: give --calib FILE or calibration.dataset in the recipe");
    CalibrationOptions co;
    co.num_samples = recipe.calibration.num_samples;
    co.seq_len = recipe.calibration.seq_len;
    co.seed = recipe.calibration.seed;
    co.text_field = recipe.calibration.text_field;
    if (model->max_context() > 0 && co.seq_len > model->max_context())
      throw invalid_input(recipe.source, "calibration.seq_len " + std::to_string(co.seq_len) + " exceeds the model's context " +
                                             std::to_string(model->max_context()));
    samples = load_calibration(calib, *tok, co);
  }

  QuantizeSummary sum;
  sum.format = format;
  sum.method = gptq ? "gptq" : "rtn";
  sum.samples = static_cast<int64_t>(samples.size());
  for (const auto& s : samples) sum.tokens += static_cast<int64_t>(s.size());

  StagingDir stage(job.out);
  SafetensorsWriter writer(stage.path(), "model", recipe.export_.max_shard_bytes);
  Checkpoint ck = Checkpoint::open(rm.dir);
  std::set<std::string> written;

  const QuantizeFn quantize = [&](const LinearToQuantize& in) -> std::optional<QuantizedLinear> {
    auto it = plan.find(in.name);
    if (it == plan.end()) return std::nullopt;
    const ModifierSpec::Group& g = it->second.group;
    QuantizedLinear out;
    out.name = in.name;
    const RangeObserver obs = g.observer == "mse" ? RangeObserver::Mse : RangeObserver::MinMax;
    if (gptq) {
      GptqOptions o;
      o.block_size = mod.block_size;
      o.dampening_frac = mod.dampening_frac;
      o.actorder = actorder_of(g.actorder);
      o.observer = obs;
      o.pool = &pool;
      GptqResult r = gptq_quantize(in.weight->data(), in.rows, in.cols, *in.hessian, g.weights, o, in.name);
      out.q = std::move(r.q);
      out.note = r.fallback;
    } else {
      out.q = quantize_rtn(in.weight->data(), in.rows, in.cols, g.weights, obs);
    }
    return out;
  };
  // Plain (RTN) quantization needs no forward passes: a single pseudo-sample
  // keeps the pipeline's bookkeeping while the Hessians stay unused.
  if (!gptq) samples = {{tok->bos_id() >= 0 ? tok->bos_id() : 0, 0}};

  double err_sum = 0;
  run_sequential(*model, samples, quantize, pool, [&](int64_t li, std::vector<QuantizedLinear>& done, double secs) {
    double worst = 0;
    for (auto& d : done) {
      if (format == "gptq") add_gptq_linear(writer, d.name, d.q);
      else add_compressed_tensors_linear(writer, d.name, d.q);
      written.insert(d.name + ".weight");
      ++sum.linears;
      err_sum += d.error;
      worst = std::max(worst, d.error);
      sum.max_error = std::max(sum.max_error, d.error);
      if (!d.note.empty()) log("note: " + d.note);
    }
    char line[256];
    std::snprintf(line, sizeof line, "layer %lld/%lld: %zu linears in %.2f s, relative error mean %.3g, max %.3g",
                  static_cast<long long>(li + 1), static_cast<long long>(cfg.num_hidden_layers), done.size(), secs,
                  done.empty() ? 0.0 : [&] { double s = 0; for (auto& d : done) s += d.error; return s / done.size(); }(),
                  worst);
    log(line);
    ++sum.layers;
  }, SequentialOptions{gptq, job.max_memory_bytes});
  sum.mean_error = sum.linears ? err_sum / static_cast<double>(sum.linears) : 0;

  // Everything not quantized is copied as it is. lm_head is never quantized
  // here; it is listed in ignore even when tied to the embeddings (it is
  // still a Linear a loader would otherwise look for).
  std::vector<std::string> ignore = {"lm_head"};
  for (const std::string& name : ck.names()) {
    if (written.count(name)) continue;
    writer.add(name, ck.tensor(name));
    const std::string suffix = ".weight";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        ck.info(name).shape.size() == 2 && name.find("embed_tokens") == std::string::npos &&
        name != "lm_head.weight")
      ignore.push_back(name.substr(0, name.size() - suffix.size()));
  }
  writer.set_metadata({{"format", "pt"}});
  writer.finish();

  nlohmann::ordered_json config = cfg.raw;
  if (format == "gptq") {
    const ModifierSpec::Group& g = plan.begin()->second.group;
    GptqConfigExtras ex;
    ex.damp_percent = mod.dampening_frac;
    ex.static_groups = g.actorder == "weight" || g.actorder == "static";
    nlohmann::json qc = gptq_quantize_config(g.weights, g.actorder == "group", ex);
    write_file_atomic(stage.path() / "quantize_config.json", qc.dump(2) + "\n");
    config["quantization_config"] = qc;
  } else {
    // Groups in the recipe's order, each once.
    std::vector<CompressedTensorsGroup> list;
    std::vector<std::string> order;
    for (const auto& mg : mod.groups) {
      const auto p = std::find_if(plan.begin(), plan.end(), [&](const auto& e) { return e.second.group.name == mg.name; });
      if (p == plan.end()) continue;
      CompressedTensorsGroup cg;
      cg.scheme = p->second.group.weights;
      cg.targets = p->second.group.targets;
      cg.actorder_group = p->second.group.actorder == "group";
      cg.observer = p->second.group.observer == "mse" ? "mse" : "memoryless_minmax";
      list.push_back(cg);
      order.push_back(mg.name);
    }
    nlohmann::json qc = compressed_tensors_config(list, ignore);
    // GPTQ's static act-order is recorded as llm-compressor records it.
    for (size_t i = 0; i < order.size(); ++i) {
      const auto& p = std::find_if(plan.begin(), plan.end(), [&](const auto& e) { return e.second.group.name == order[i]; });
      if (gptq && p != plan.end() && p->second.group.actorder == "weight")
        qc["config_groups"]["group_" + std::to_string(i)]["weights"]["actorder"] = "static";
    }
    config["quantization_config"] = qc;
  }
  write_file_atomic(stage.path() / "config.json", config.dump(2) + "\n");
  for (const char* f : kCopiedFiles)
    if (fs::exists(rm.dir / f)) fs::copy_file(rm.dir / f, stage.path() / f);
  write_file_atomic(stage.path() / "recipe.yaml", recipe.text);
  write_manifest(stage.path());
  for (const auto& e : fs::directory_iterator(stage.path())) sum.output_bytes += e.is_regular_file() ? e.file_size() : 0;
  stage.commit();
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sum.peak_rss_bytes = eval::peak_rss_bytes();
  uint64_t act = 0;
  for (const auto& s : samples) act += s.size() * static_cast<uint64_t>(cfg.hidden_size) * 4;
  sum.spilled = job.max_memory_bytes > 0 && act > job.max_memory_bytes;
  return sum;
}

}  // namespace qf
