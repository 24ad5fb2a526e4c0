// The export stage (calibration/quantize_run.h): everything the output holds
// besides the quantized Linears the layers stage wrote.
#include <set>

#include "calibration/quantize_run.h"
#include "checkpoint/checkpoint_format.h"
#include "checkpoint/lora_merge.h"
#include "core/version.h"
#include "formats/hf/model_tensors.h"
#include "runtime/router_linears.h"

namespace qf {
namespace {

const char* kCopiedFiles[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                              "generation_config.json", "vocab.json", "merges.txt", "added_tokens.json",
                              "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
                              "processor_config.json", "video_preprocessor_config.json"};

// The tensors of the model as it is now, for everything the pipeline does not
// write as quantized: norms (SmoothQuant and AWQ rescale them), biases and
// Linears left in full precision (AWQ may have rescaled those too), in the
// checkpoint's dtype. Unchanged values round-trip exactly (f16/bf16 -> f32 -> same).
void add_current(SafetensorsWriter& w, const Checkpoint& ck, const std::string& name, const std::vector<float>& v,
                 std::set<std::string>& written) {
  const TensorInfo& info = ck.info(name);
  w.add(name, Tensor::from_f32(v, info.shape).to(info.dtype));
  written.insert(name);
}

}  // namespace

void export_stage(QuantizeRun& r) {
  namespace fs = std::filesystem;
  const ModelConfig& cfg = r.cfg;
  const CheckpointFormat& format = *r.plan.format;
  SafetensorsWriter& writer = *r.writer;
  const Checkpoint ck = open_checkpoint_with_loras(r.rm.dir, r.job.loras);

  // Norms, biases, full-precision Linears and routers of the decoder layers,
  // as the pipeline left them.
  for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) {
    const std::string p = "model.layers." + std::to_string(li) + ".";
    const rt::LayerWeights& L = r.model->weights().layers[static_cast<size_t>(li)];
    add_current(writer, ck, p + "input_layernorm.weight", L.attn_norm, r.written);
    add_current(writer, ck, p + "post_attention_layernorm.weight", L.ffn_norm, r.written);
    for (const rt::LayerLinearId& id : rt::layer_linears(cfg, li)) {
      const rt::Linear& lin = *rt::layer_linear(L, id);
      const std::string base = p + id.name;
      if (ck.contains(base + ".bias")) add_current(writer, ck, base + ".bias", lin.bias_values(), r.written);
      if (!r.written.count(base + ".weight")) add_current(writer, ck, base + ".weight", lin.decode_all(), r.written);
    }
    for (const rt::RouterLinear& rl : rt::router_linears(cfg, li))  // smoothing scales them
      add_current(writer, ck, p + rl.name + ".weight", (L.moe.*rl.member)->decode_all(), r.written);
  }
  // FP8 KV-cache scales: amax / 448 of the calibrated K (after RoPE) and V;
  // modelopt's export raises them to at least 1 (llm-compressor's does not).
  std::vector<KvScales> kv;
  for (const auto& [k, v] : r.kv_amax) kv.push_back({k > 0 ? k / 448.0f : 1.0f, v > 0 ? v / 448.0f : 1.0f});
  for (size_t li = 0; li < kv.size(); ++li) format.add_kv_scales(writer, static_cast<int64_t>(li), kv[li], plan_scale_dtype(cfg));

  // Everything else is copied as it is. lm_head is never quantized here; it
  // is listed in ignore even when tied to the embeddings (it is still a
  // Linear a loader would otherwise look for).
  std::vector<std::string> ignore = {"lm_head"};
  std::set<std::string> quantized;
  for (const auto& [name, _] : r.plan.linears) quantized.insert(name);
  export_vision_linears(r, ck, quantized);
  for (const std::string& name : ck.names()) {
    const std::string module = linear_weight_module(ck, name);
    if (!module.empty() && module != "lm_head" && !quantized.count(module)) ignore.push_back(module);
    if (r.written.count(name)) continue;
    const Tensor t = ck.tensor(name);
    writer.add(name, t);
    release_mapped_pages(t.data(), static_cast<size_t>(t.nbytes()));  // read once: not kept resident
  }
  writer.set_metadata({{"format", "pt"}});
  writer.finish();

  const fs::path out = r.stage->path();
  nlohmann::ordered_json config = cfg.raw;
  ExportConfig ec = r.plan.export_config;
  // Module names as the checkpoint spells them (a vision-language model's
  // language model may live under "model.language_model." or
  // "language_model.model.").
  const TensorNaming& naming = ck.naming();
  for (std::string& m : ignore) m = naming.module_to_stored(m);
  for (ExportGroup& g : ec.groups)
    for (std::string& t : g.targets)
      if (t.compare(0, 6, "model.") == 0 || t == "lm_head") t = naming.module_to_stored(t);
  ec.ignore = ignore;
  for (ExportGroup& g : vision_export_groups(r.vision, naming)) ec.groups.push_back(std::move(g));
  format.write_config(ec, config, out);
  write_file_atomic(out / "config.json", config.dump(2) + "\n");
  for (const char* f : kCopiedFiles)
    if (fs::exists(r.rm.dir / f)) fs::copy_file(r.rm.dir / f, out / f);
  // The recipe as run: with calibration, its dataset is the absolute path
  // actually read (--calib included), so the copy reproduces the output.
  r.dataset = r.calib_used.string();
  if (!r.calib_used.empty() && r.job.copy_calibration) {
    r.dataset = r.calib_used.extension() == ".jsonl" ? "calibration.jsonl" : "calibration.txt";
    fs::copy_file(r.calib_used, out / r.dataset);  // relative to the copied recipe: it travels with the output
  }
  r.recipe_copy = r.calib_used.empty()
                      ? r.recipe.text
                      : resolved_recipe_text(r.recipe, r.dataset,
                                             std::string("# The recipe as quantforge ") + version() +
                                                 " ran it (calibration resolved; the original's comments are not kept).\n");
  write_file_atomic(out / "recipe.yaml", r.recipe_copy);
  uint64_t act = 0;
  for (const auto& s : r.samples) act += s.size() * static_cast<uint64_t>(cfg.hidden_size) * 4;
  r.sum.spilled = r.job.max_memory_bytes > 0 && act > r.job.max_memory_bytes;
}

}  // namespace qf
