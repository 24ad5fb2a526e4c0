#include "runtime/kv_format.h"

#include <algorithm>

#include "core/error.h"

namespace qf::rt {

namespace {

struct Named {
  KvDType t;
  const char* name;
};
constexpr Named kNames[] = {
    {KvDType::F16, "f16"},       {KvDType::F8_E4M3, "f8"},    {KvDType::I8, "int8"},
    {KvDType::Q8_0, "q8_0"},     {KvDType::Q4_0, "q4_0"},     {KvDType::Q4_1, "q4_1"},
    {KvDType::Q5_0, "q5_0"},     {KvDType::Q5_1, "q5_1"},     {KvDType::IQ4_NL, "iq4_nl"},
    {KvDType::NVFP4, "nvfp4"},   {KvDType::KIVI2, "kivi2"},   {KvDType::KIVI4, "kivi4"},
    {KvDType::TQ_K8, "tq_k8"},   {KvDType::TQ_K4_NC, "tq_k4_nc"}, {KvDType::TQ_K3_NC, "tq_k3_nc"},
    {KvDType::TQ_V4, "tq_v4"},   {KvDType::TQ_V3, "tq_v3"},
};

struct Preset {
  const char* name;
  KvDType k, v;
};
// vLLM's TQ_PRESETS: key bits 8 (FP8), 4 or 3 (Lloyd-Max, norm-corrected in
// the _nc presets); value bits 4 or 3 (uniform).
constexpr Preset kPresets[] = {
    {"turboquant_k8v4", KvDType::TQ_K8, KvDType::TQ_V4},
    {"turboquant_4bit_nc", KvDType::TQ_K4_NC, KvDType::TQ_V4},
    {"turboquant_k3v4_nc", KvDType::TQ_K3_NC, KvDType::TQ_V4},
    {"turboquant_3bit_nc", KvDType::TQ_K3_NC, KvDType::TQ_V3},
};
constexpr int64_t kTurboQuantEdge = 2;

const char* kUserTypes = "f16, f8, int8, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, nvfp4, kivi2, kivi4";

}  // namespace

const char* kv_dtype_name(KvDType t) {
  for (const Named& n : kNames)
    if (n.t == t) return n.name;
  return "?";
}

KvDType parse_kv_dtype(const std::string& s) {
  if (s == "fp16") return KvDType::F16;
  if (s == "fp8" || s == "f8_e4m3" || s == "fp8_e4m3") return KvDType::F8_E4M3;
  if (s == "i8") return KvDType::I8;
  for (const Named& n : kNames)
    if (s == n.name && std::string(n.name).rfind("tq_", 0) != 0) return n.t;
  std::string msg = "unknown KV-cache type '" + s + "' (expected " + kUserTypes + ", or a TurboQuant preset:";
  for (const Preset& p : kPresets) msg += std::string(" ") + p.name;
  throw Error(ErrorKind::Usage, msg + ")");
}

namespace {
bool edge_layer(int64_t keep, int64_t layer, int64_t n_layers) {
  const int64_t e = keep < 0 ? std::min<int64_t>(kTurboQuantEdge, n_layers / 2) : keep;
  return layer < e || layer >= n_layers - e;
}
}  // namespace

KvDType KvFormat::k_at(int64_t layer, int64_t n_layers) const { return edge_layer(keep_f16_edge, layer, n_layers) ? KvDType::F16 : k; }

KvDType KvFormat::v_at(int64_t layer, int64_t n_layers) const { return edge_layer(keep_f16_edge, layer, n_layers) ? KvDType::F16 : v; }

bool KvFormat::has_kivi() const { return kv_is_kivi(k) || kv_is_kivi(v); }

std::string KvFormat::name() const {
  std::string s = !preset.empty() ? preset
                  : k == v        ? std::string(kv_dtype_name(k))
                                  : std::string("k=") + kv_dtype_name(k) + ",v=" + kv_dtype_name(v);
  if (!preset.empty() && keep_f16_edge >= 0) s += "+edge" + std::to_string(keep_f16_edge);
  if (rotation == KvRotation::Hadamard) s += "+hadamard";
  return s;
}

std::string KvFormat::vllm_flag() const {
  // vLLM adds its edge layers to any --kv-cache-dtype-skip-layers: other
  // edges have no flag there.
  if (!preset.empty()) return keep_f16_edge >= 0 ? "" : "--kv-cache-dtype " + preset;
  if (k == v && k == KvDType::F16) return "--kv-cache-dtype auto";
  if (k == v && k == KvDType::F8_E4M3) return "--kv-cache-dtype fp8";
  return "";
}

std::string KvFormat::llama_cpp_flags(int64_t head_dim) const {
  auto ok = [](KvDType t) { return t == KvDType::F16 || kv_is_block(t); };
  if (!preset.empty() || !ok(k) || !ok(v)) return "";
  if (rotation == KvRotation::Hadamard && head_dim % 64 != 0) return "";  // llama.cpp leaves such heads unrotated
  std::string s = std::string("-ctk ") + kv_dtype_name(k) + " -ctv " + kv_dtype_name(v);
  if (v != KvDType::F16) s += " -fa";  // a quantized V cache needs flash attention
  // Builds from April 2026 on rotate quantized caches of heads divisible by
  // 64 unless LLAMA_ATTN_ROT_DISABLE is set; b4748 never does.
  if (k == KvDType::F16 && v == KvDType::F16) return s;
  return s + (rotation == KvRotation::Hadamard ? " (a build from April 2026 on: it rotates)"
                                               : " (b4748; later builds: LLAMA_ATTN_ROT_DISABLE=1)");
}

bool operator==(const KvFormat& a, const KvFormat& b) {
  return a.k == b.k && a.v == b.v && a.rotation == b.rotation && a.keep_f16_edge == b.keep_f16_edge &&
         a.preset == b.preset;
}

KvFormat parse_kv_format(const std::string& both, const std::string& k, const std::string& v,
                         const std::string& rotation, int64_t f16_edge) {
  KvFormat f;
  bool preset = false;
  for (const Preset& p : kPresets)
    if (both == p.name) {
      f.k = p.k, f.v = p.v, f.keep_f16_edge = -1, f.preset = p.name;
      preset = true;
    }
  if (!preset && !both.empty()) f = KvFormat(parse_kv_dtype(both));
  if (preset && (!k.empty() || !v.empty()))
    throw Error(ErrorKind::Usage, "--kv-dtype " + both + " sets both sides; drop --kv-k-dtype/--kv-v-dtype");
  if (f16_edge >= 0) {
    if (!preset) throw Error(ErrorKind::Usage, "--kv-f16-edge-layers applies to the TurboQuant presets");
    f.keep_f16_edge = f16_edge;
  }
  if (!k.empty()) f.k = parse_kv_dtype(k);
  if (!v.empty()) f.v = parse_kv_dtype(v);
  if (rotation == "hadamard") {
    if (preset) throw Error(ErrorKind::Usage, "--kv-rotation: the TurboQuant presets rotate their keys themselves");
    for (KvDType t : {f.k, f.v})
      if (t != KvDType::F16 && !kv_is_block(t))
        throw Error(ErrorKind::Usage, std::string("--kv-rotation hadamard is llama.cpp's, for its block types (q8_0, "
                                                  "q4_0, q4_1, q5_0, q5_1, iq4_nl); not for ") + kv_dtype_name(t));
    if (f.k == KvDType::F16 && f.v == KvDType::F16)
      throw Error(ErrorKind::Usage, "--kv-rotation hadamard rotates quantized caches only; this one is f16");
    f.rotation = KvRotation::Hadamard;
  } else if (rotation != "none" && !rotation.empty()) {
    throw Error(ErrorKind::Usage, "unknown --kv-rotation '" + rotation + "' (expected none or hadamard)");
  }
  return f;
}

KvFormat parse_kv_format_name(const std::string& name) {
  std::string base = name, rotation = "none";
  int64_t edge = -1;
  for (;;) {
    const size_t plus = base.rfind('+');
    if (plus == std::string::npos) break;
    const std::string suffix = base.substr(plus + 1);
    if (suffix == "hadamard") {
      rotation = "hadamard";
    } else if (suffix.rfind("edge", 0) == 0 && suffix.size() > 4 &&
               suffix.find_first_not_of("0123456789", 4) == std::string::npos && suffix.size() < 12) {
      edge = std::stoll(suffix.substr(4));
    } else {
      throw Error(ErrorKind::Usage, "unknown KV-cache format suffix '+" + suffix + "' in '" + name +
                                        "' (expected +hadamard or +edgeN)");
    }
    base.resize(plus);
  }
  if (base.rfind("k=", 0) == 0) {
    const size_t comma = base.find(",v=");
    if (comma == std::string::npos)
      throw Error(ErrorKind::Usage, "'" + name + "': a key/value pair is written k=TYPE,v=TYPE");
    return parse_kv_format("f16", base.substr(2, comma - 2), base.substr(comma + 3), rotation, edge);
  }
  return parse_kv_format(base, "", "", rotation, edge);
}

std::vector<KvFormat> kv_sweep_formats(int64_t n_layers) {
  std::vector<KvFormat> out;
  for (KvDType t : {KvDType::F16, KvDType::F8_E4M3, KvDType::I8, KvDType::Q8_0, KvDType::Q5_1, KvDType::Q5_0,
                    KvDType::Q4_1, KvDType::Q4_0, KvDType::IQ4_NL}) {
    out.emplace_back(t);
    if (kv_is_block(t) && t != KvDType::Q8_0) {
      KvFormat r(t);
      r.rotation = KvRotation::Hadamard;
      out.push_back(r);
    }
  }
  // llama.cpp's common mixed pair: 8-bit keys, 4-bit values.
  KvFormat mixed;
  mixed.k = KvDType::Q8_0, mixed.v = KvDType::Q4_0;
  out.push_back(mixed);
  for (const Preset& p : kPresets) out.push_back(parse_kv_format(p.name));
  if (2 * std::min<int64_t>(kTurboQuantEdge, n_layers / 2) >= n_layers)  // the rule compresses no layer
    for (const Preset& p : kPresets) out.push_back(parse_kv_format(p.name, "", "", "none", 0));
  out.emplace_back(KvDType::NVFP4);
  out.emplace_back(KvDType::KIVI4);
  out.emplace_back(KvDType::KIVI2);
  return out;
}

std::string kv_dtype_fits(KvDType t, int64_t head_dim) {
  int64_t need = 1;
  if (kv_is_block(t) || kv_is_kivi(t)) need = 32;
  else if (t == KvDType::NVFP4) need = 16;
  else if (t == KvDType::TQ_K3_NC || t == KvDType::TQ_K4_NC || t == KvDType::TQ_V3 || t == KvDType::TQ_V4) need = 8;
  if (head_dim % need != 0)
    return std::string(kv_dtype_name(t)) + " needs a head size that is a multiple of " + std::to_string(need) +
           ", this model's is " + std::to_string(head_dim);
  if ((t == KvDType::TQ_K3_NC || t == KvDType::TQ_K4_NC) && (head_dim & (head_dim - 1)) != 0)
    return std::string(kv_dtype_name(t)) + " rotates by a Hadamard transform, which needs a power-of-two head size";
  return "";
}

}  // namespace qf::rt
