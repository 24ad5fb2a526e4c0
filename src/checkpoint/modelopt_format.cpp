#include "checkpoint/modelopt_format.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/io.h"
#include "checkpoint/checkpoint_format.h"
#include "checkpoint/checked_tensor.h"
#include "checkpoint/pack.h"

namespace qf {
namespace {

using json = nlohmann::json;

void add_scalar(SafetensorsWriter& w, const std::string& name, float v) {
  if (!(std::isfinite(v) && v > 0)) throw invalid_input(name, "scale must be positive and finite, got " + std::to_string(v));
  w.add(name, DType::F32, {}, &v, sizeof v);
}

float read_scalar(const Checkpoint& ck, const std::string& name) {
  const TensorInfo& info = ck.info(name);
  const float v = fetch_checked(ck, name, {DType::F32}, info.shape.empty() ? Shape{} : Shape{1}).to_f32_vector().at(0);
  if (!(std::isfinite(v) && v > 0)) throw invalid_input(name, "scale must be positive and finite, got " + std::to_string(v));
  return v;
}

float reciprocal(float v) { return static_cast<float>(1.0 / static_cast<double>(v)); }

const json& quantization_part(const json& cfg) {
  if (cfg.is_object() && cfg.contains("quantization") && cfg["quantization"].is_object()) return cfg["quantization"];
  return cfg;
}

}  // namespace

void add_modelopt_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q, const ActQuantParams* act) {
  q.validate(prefix);
  if (act) act->scheme.validate(prefix + " input activations");
  const QuantScheme& s = q.scheme;
  const int64_t out = q.rows, in = q.cols;
  if (s.is_fp8()) {
    if (s.strategy != QuantStrategy::Tensor)
      throw unsupported(prefix, "modelopt FP8 has per-tensor weight scales, got " + s.describe());
    if (!act || act->scheme.type != QuantType::Float || act->scheme.bits != 8 || act->scheme.dynamic ||
        act->scheme.strategy != QuantStrategy::Tensor)
      throw unsupported(prefix, "modelopt FP8 needs static per-tensor FP8 activations, got " +
                                    (act ? act->scheme.describe() : std::string("none")));
    w.add(prefix + ".weight", DType::F8_E4M3, {out, in}, q.q.data(), q.q.size());
    add_scalar(w, prefix + ".weight_scale", q.scales[0]);
    add_scalar(w, prefix + ".input_scale", act->scale);
    return;
  }
  if (!s.is_nvfp4()) throw unsupported(prefix, "modelopt export holds FP8 or NVFP4 weights, not " + s.describe());
  if (act && !act->scheme.is_nvfp4())
    throw unsupported(prefix, "NVFP4 weights go with NVFP4 activations or none, not " + act->scheme.describe());
  const std::vector<uint8_t> packed = pack_nvfp4_rows(q);
  w.add(prefix + ".weight", DType::U8, {out, in / 2}, packed.data(), packed.size());
  const std::vector<uint8_t> sc = nvfp4_scales_e4m3(q);
  w.add(prefix + ".weight_scale", DType::F8_E4M3, {out, q.n_groups()}, sc.data(), sc.size());
  add_scalar(w, prefix + ".weight_scale_2", reciprocal(q.global_scale));
  if (act) add_scalar(w, prefix + ".input_scale", reciprocal(act->global_scale));
}

void add_modelopt_kv_scales(SafetensorsWriter& w, const std::string& layer_prefix, const KvScales& kv) {
  add_scalar(w, layer_prefix + ".self_attn.k_proj.k_scale", kv.k_scale);
  add_scalar(w, layer_prefix + ".self_attn.v_proj.v_scale", kv.v_scale);
}

KvScales modelopt_fp8_kv_scales(const KvScales& calibrated) {
  return KvScales{std::max(calibrated.k_scale, 1.0f), std::max(calibrated.v_scale, 1.0f)};
}

KvScales read_modelopt_kv_scales(const Checkpoint& ck, const std::string& layer_prefix) {
  return KvScales{read_scalar(ck, layer_prefix + ".self_attn.k_proj.k_scale"),
                  read_scalar(ck, layer_prefix + ".self_attn.v_proj.v_scale")};
}

json modelopt_hf_quant_config(const std::string& quant_algo, const std::optional<std::string>& kv_cache_quant_algo,
                              std::optional<int> group_size, const std::vector<std::string>& exclude_modules,
                              const std::string& producer_version) {
  const std::string where = "modelopt config";
  if (quant_algo != "FP8" && quant_algo != "NVFP4" && quant_algo != "W4A16_NVFP4")
    throw unsupported(where, "quant_algo '" + quant_algo + "' (supported: FP8, NVFP4, W4A16_NVFP4)");
  if (kv_cache_quant_algo && *kv_cache_quant_algo != "FP8")
    throw unsupported(where, "kv_cache_quant_algo '" + *kv_cache_quant_algo + "' (supported: FP8 or none)");
  if (quant_algo != "FP8" && group_size && *group_size != 16)
    throw unsupported(where, "NVFP4 group_size " + std::to_string(*group_size) + " (NVFP4 blocks are 16)");
  json qz = json::object();
  qz["quant_algo"] = quant_algo;
  qz["kv_cache_quant_algo"] = kv_cache_quant_algo ? json(*kv_cache_quant_algo) : json(nullptr);
  if (group_size) qz["group_size"] = *group_size;
  qz["exclude_modules"] = exclude_modules;
  return json{{"producer", {{"name", "modelopt"}, {"version", producer_version}}}, {"quantization", std::move(qz)}};
}

json modelopt_config_block(const json& hf) {
  const json& qz = quantization_part(hf);
  const std::string algo = modelopt_quant_algo(hf);
  const json gs = qz.value("group_size", json(16));
  json g = json::object();
  if (algo == "FP8") {
    g["input_activations"] = {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}};
    g["weights"] = {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}};
  } else if (algo == "NVFP4") {
    g["input_activations"] = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", gs}};
    g["weights"] = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", gs}};
  } else if (algo == "W4A16_NVFP4") {
    g["weights"] = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", gs}};
  } else {
    throw unsupported("modelopt config", "quant_algo '" + algo + "' (supported: FP8, NVFP4, W4A16_NVFP4)");
  }
  g["targets"] = {"Linear"};
  json c = json::object();
  c["config_groups"] = {{"group_0", std::move(g)}};
  c["ignore"] = qz.value("exclude_modules", json::array());
  c["quant_algo"] = algo;
  const std::string kv = modelopt_kv_cache_algo(hf);
  if (kv == "FP8") c["kv_cache_scheme"] = {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}};
  else if (!kv.empty()) throw unsupported("modelopt config", "kv_cache_quant_algo '" + kv + "' (supported: FP8 or none)");
  if (hf.contains("producer")) c["producer"] = hf["producer"];
  c["quant_method"] = "modelopt";
  return c;
}

std::string modelopt_quant_algo(const json& cfg) {
  const json& qz = quantization_part(cfg);
  if (!qz.is_object() || !qz.contains("quant_algo") || !qz["quant_algo"].is_string())
    throw invalid_input("modelopt config", "no quant_algo string");
  return qz["quant_algo"].get<std::string>();
}

std::string modelopt_kv_cache_algo(const json& cfg) {
  const json& qz = quantization_part(cfg);
  if (qz.is_object()) {
    auto it = qz.find("kv_cache_quant_algo");
    if (it != qz.end() && it->is_string()) return it->get<std::string>();
    // The config.json block keeps only kv_cache_scheme.
    it = qz.find("kv_cache_scheme");
    if (it != qz.end() && it->is_object()) {
      if (it->value("num_bits", 0) == 8 && it->value("type", "") == "float") return "FP8";
      throw unsupported("modelopt config", "kv_cache_scheme " + it->dump());
    }
    if (it != qz.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

ModeloptLinear read_modelopt_linear(const Checkpoint& ck, const std::string& prefix, const json& cfg) {
  const std::string algo = modelopt_quant_algo(cfg);
  ModeloptLinear r;
  QuantizedTensor& q = r.q;
  const std::string wn = prefix + ".weight";
  const TensorInfo& info = ck.info(wn);
  if (info.shape.size() != 2 || info.shape[0] < 1 || info.shape[1] < 1)
    throw invalid_input(wn, "shape is " + shape_str(info.shape) + ", expected a non-empty matrix");
  if (algo == "FP8") {
    q.scheme = QuantScheme::fp8(QuantStrategy::Tensor, DType::F32);
    q.rows = info.shape[0];
    q.cols = info.shape[1];
    q.q = copy_elements<uint8_t>(fetch_checked(ck, wn, {DType::F8_E4M3}, info.shape));
    q.scales = {read_scalar(ck, prefix + ".weight_scale")};
    ActQuantParams a;
    a.scheme = ActivationScheme::fp8_tensor_static();
    a.scale = read_scalar(ck, prefix + ".input_scale");
    r.act = a;
  } else if (algo == "NVFP4" || algo == "W4A16_NVFP4") {
    q.scheme = QuantScheme::nvfp4();
    if (info.shape[1] % 8 != 0)
      throw invalid_input(wn, "shape is " + shape_str(info.shape) + ", expected [out, in/2] with in a multiple of 16");
    q.rows = info.shape[0];
    q.cols = info.shape[1] * 2;
    const auto packed = copy_elements<uint8_t>(fetch_checked(ck, wn, {DType::U8}, info.shape));
    q.q.resize(packed.size() * 2);
    for (size_t i = 0; i < packed.size(); ++i) q.q[2 * i] = packed[i] & 0xf, q.q[2 * i + 1] = packed[i] >> 4;
    const std::string sn = prefix + ".weight_scale";
    const auto sc = copy_elements<uint8_t>(fetch_checked(ck, sn, {DType::F8_E4M3}, {q.rows, q.n_groups()}));
    for (uint8_t b : sc) {
      if ((b & 0x7f) == 0x7f) throw invalid_input(sn, "a block scale is NaN");
      q.scales.push_back(f8e4m3_to_f32(b));
    }
    q.global_scale = reciprocal(read_scalar(ck, prefix + ".weight_scale_2"));
    if (algo == "NVFP4") {
      ActQuantParams a;
      a.scheme = ActivationScheme::nvfp4();
      a.global_scale = reciprocal(read_scalar(ck, prefix + ".input_scale"));
      r.act = a;
    }
  } else {
    throw unsupported(prefix, "modelopt quant_algo '" + algo + "' (supported: FP8, NVFP4, W4A16_NVFP4)");
  }
  q.validate(prefix);
  return r;
}

// ---- the checkpoint format --------------------------------------------------

namespace {

std::string layer_module(int64_t layer) { return "model.layers." + std::to_string(layer); }

class ModeloptFormat final : public CheckpointFormat {
 public:
  const char* name() const override { return "modelopt"; }

  void check_linear(const LinearCheck& c) const override {
    const QuantScheme& w = *c.weights;
    const ActivationScheme* a = c.act;
    const bool fp8 = w.is_fp8() && w.strategy == QuantStrategy::Tensor && a && a->type == QuantType::Float &&
                     a->bits == 8 && a->strategy == QuantStrategy::Tensor && !a->dynamic;
    const bool nvfp4 = w.is_nvfp4() && (!a || a->is_nvfp4());
    if (!fp8 && !nvfp4)
      throw unsupported(c.where, "the modelopt format holds FP8 (per-tensor weights, static per-tensor inputs: preset FP8) "
                                 "and NVFP4 (NVFP4, NVFP4A16); this group is " + w.describe() +
                                     (a ? " / " + a->describe() : std::string(" weight-only")));
  }
  bool one_scheme_per_model() const override { return true; }
  bool every_linear_quantized() const override { return false; }
  bool holds_kv_scales() const override { return true; }

  void add_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q,
                  const ActQuantParams* act) const override {
    add_modelopt_linear(w, prefix, q, act);
  }
  void add_kv_scales(SafetensorsWriter& w, int64_t layer, const KvScales& calibrated, DType) const override {
    add_modelopt_kv_scales(w, layer_module(layer), modelopt_fp8_kv_scales(calibrated));
  }
  void write_config(const ExportConfig& c, nlohmann::ordered_json& config,
                    const std::filesystem::path& folder) const override {
    const ExportGroup& g = c.groups.at(0);
    const std::string algo = g.weights.is_fp8() ? "FP8" : g.act ? "NVFP4" : "W4A16_NVFP4";
    const nlohmann::json hq =
        modelopt_hf_quant_config(algo, c.kv_cache ? std::optional<std::string>("FP8") : std::nullopt,
                                 g.weights.is_nvfp4() ? std::optional<int>(16) : std::nullopt, c.ignore);
    write_file_atomic(folder / "hf_quant_config.json", hq.dump(4) + "\n");
    config["quantization_config"] = modelopt_config_block(hq);
  }

  OpenedConfig open(const std::filesystem::path& dir, const nlohmann::json& qcfg,
                    const std::string& config_file) const override {
    OpenedConfig o{qcfg, false};
    // hf_quant_config.json is modelopt's own description; config.json's block mirrors it.
    if (path_exists(dir / "hf_quant_config.json")) {
      const std::filesystem::path hq = dir / "hf_quant_config.json";
      o.qcfg = nlohmann::json::parse(read_text_file(hq), nullptr, false);
      if (!o.qcfg.is_object()) throw invalid_input(hq.string(), "not a JSON object");
    }
    const std::string algo = modelopt_quant_algo(o.qcfg);
    if (algo != "FP8" && algo != "NVFP4" && algo != "W4A16_NVFP4")
      throw unsupported(config_file, "modelopt quant_algo '" + algo + "' is not supported by the runtime (FP8, NVFP4, W4A16_NVFP4)");
    const std::string kv = modelopt_kv_cache_algo(o.qcfg);
    if (!kv.empty() && kv != "FP8")
      throw unsupported(config_file, "modelopt kv_cache_quant_algo '" + kv + "' is not supported by the runtime (FP8)");
    o.kv_scales = kv == "FP8";
    return o;
  }
  std::optional<ReadLinear> read_linear(const Checkpoint& ck, const std::string& prefix,
                                        const nlohmann::json& qcfg) const override {
    if (!ck.contains(prefix + ".weight_scale")) return std::nullopt;
    ModeloptLinear r = read_modelopt_linear(ck, prefix, qcfg);
    return ReadLinear{std::move(r.q), std::move(r.act), false};
  }
  KvScales read_kv_scales(const Checkpoint& ck, int64_t layer) const override {
    return read_modelopt_kv_scales(ck, layer_module(layer));
  }
  std::string describe(const nlohmann::json& q) const override {
    const nlohmann::json& k = q.contains("kv_cache_scheme") ? q["kv_cache_scheme"] : nlohmann::json();
    return "modelopt: " + q.value("quant_algo", std::string("?")) + (k.is_object() ? ", kv cache fp8" : "");
  }
};

}  // namespace

const CheckpointFormat& modelopt_checkpoint_format() {
  static const ModeloptFormat f;
  return f;
}

}  // namespace qf
