// llama.cpp's per-tensor type mix; see gguf_mix.h for the rules and the source commit.
#include "quantizers/gguf_mix.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "core/error.h"
#include "formats/gguf/gguf.h"
#include "quantizers/kquants.h"

namespace qf::gguf_mix {

namespace {

// llama.cpp's LLAMA_FTYPE_* values (include/llama.h).
namespace ftype {
constexpr uint32_t ALL_F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 7, Q5_0 = 8, Q5_1 = 9, Q2_K = 10,
                   Q3_K_S = 11, Q3_K_M = 12, Q3_K_L = 13, Q4_K_S = 14, Q4_K_M = 15, Q5_K_S = 16, Q5_K_M = 17,
                   Q6_K = 18, BF16 = 32;
}

namespace gt = qf::ggml_type;

enum class Category {
  TokenEmbd, AttnQ, AttnV, AttnK, AttnQkv, AttnKvB, AttnOutput, FfnUp, FfnGate, FfnDown, Output, Other
};

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// tensor_get_category: exact names first, then substrings in llama.cpp's order.
Category category_of(const std::string& name) {
  if (name == "output.weight") return Category::Output;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Category::TokenEmbd;
  if (contains(name, "attn_qkv.weight")) return Category::AttnQkv;
  if (contains(name, "attn_kv_b.weight")) return Category::AttnKvB;
  if (contains(name, "attn_v.weight")) return Category::AttnV;
  if (contains(name, "attn_k.weight")) return Category::AttnK;
  if (contains(name, "attn_q.weight")) return Category::AttnQ;
  if (contains(name, "attn_output.weight")) return Category::AttnOutput;
  if (contains(name, "ffn_up")) return Category::FfnUp;
  if (contains(name, "ffn_gate")) return Category::FfnGate;
  if (contains(name, "ffn_down")) return Category::FfnDown;
  return Category::Other;
}

bool is_attn_v_like(Category c) {
  return c == Category::AttnV || c == Category::AttnQkv || c == Category::AttnKvB;
}

// ggml_n_dims: trailing dimensions of 1 do not count; at least 1.
int n_dims(const std::vector<int64_t>& ne) {
  int n = 1;
  for (size_t i = 0; i < ne.size(); ++i)
    if (ne[i] > 1) n = static_cast<int>(i) + 1;
  return n;
}

// Name parts that tensor_allows_quantization excludes (besides the checks in code).
const char* const kNeverQuantizedParts[] = {
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight",
    "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd",
    "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
    "mm.a.code_embd",
};

bool allows_quantization_impl(const TensorDesc& t) {
  if (n_dims(t.ne) < 2) return false;
  const std::string& name = t.name;
  if (!ends_with(name, "weight")) return false;
  for (const char* part : kNeverQuantizedParts)
    if (contains(name, part)) return false;
  // LLM_TN(arch)(POS_EMBD / TOKEN_TYPES, "weight")
  if (name == "position_embd.weight" || name == "token_types.weight") return false;
  return true;
}

// The type convert_hf_to_gguf.py gives a tensor that llama-quantize then copies.
uint32_t converter_type(const TensorDesc& t, const Preset& p) {
  const std::string& name = t.name;
  const bool force_f32 = n_dims(t.ne) <= 1 || ends_with(name, "_norm.weight") || !ends_with(name, ".weight") ||
                         contains(name, "ffn_gate_inp.") || name == "position_embd.weight" ||
                         name == "token_types.weight" || contains(name, "ssm_conv1d.");
  if (force_f32) return gt::F32;
  if (p.base_type == gt::F32 || p.base_type == gt::BF16) return p.base_type;
  return gt::F16;
}

uint32_t block_size(uint32_t type) { return ggml_type_info(type)->block_size; }
std::string type_name(uint32_t type) { return ggml_type_info(type)->name; }
bool is_block_quantized(uint32_t type) { return block_size(type) > 1; }

// sscanf(name, "blk.%d.", &layer): the number after a leading "blk.", or -1.
int parse_block(const std::string& name, bool* found = nullptr) {
  if (found) *found = false;
  if (name.compare(0, 4, "blk.") != 0) return -1;
  size_t i = 4;
  bool neg = false;
  if (i < name.size() && (name[i] == '-' || name[i] == '+')) neg = name[i++] == '-';
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  int64_t v = 0;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) {
    v = v * 10 + (name[i] - '0');
    if (v > 1000000000) v = 1000000000;  // sscanf would overflow; any huge value sorts last
  }
  if (found) *found = true;
  return static_cast<int>(neg ? -v : v);
}

bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

struct State {
  const Preset& preset;
  const ModelDesc& model;
  TypeOverrides overrides;
  bool has_imatrix = false;
  bool tied_embeddings = true;  // until output.weight is seen
  bool is_70b = false;
  bool falcon = false;
  int64_t n_gqa = 0;
  int64_t n_attention_wv = 0, i_attention_wv = 0;
  int64_t n_ffn_down = 0, i_ffn_down = 0, n_ffn_gate = 0, i_ffn_gate = 0, n_ffn_up = 0, i_ffn_up = 0;
};

// layer_info: the counter for dense models, the "blk.N." of the name for MoE.
int64_t layer_of(const State& s, int64_t counter, const std::string& name) {
  if (s.model.n_expert <= 1) return counter;
  bool found = false;
  const int layer = parse_block(name, &found);
  if (!found) throw invalid_input(name, "cannot determine the layer of this MoE tensor (no \"blk.N.\" prefix)");
  if (layer < 0 || layer >= s.model.n_layer)
    throw invalid_input(name, "layer " + std::to_string(layer) + " is outside [0, " +
                                  std::to_string(s.model.n_layer) + ")");
  return layer;
}

// llama_tensor_get_type_impl restricted to our presets.
uint32_t mix_type(State& s, uint32_t type, const TensorDesc& t, Category cat, std::string& note) {
  const uint32_t ft = s.preset.ftype;
  const int64_t n_expert = s.model.n_expert;
  if (cat == Category::Output || (s.tied_embeddings && cat == Category::TokenEmbd)) {
    const int64_t nx = t.ne[0];
    const int64_t qk = block_size(type);
    if (s.overrides.output != kNoOverride) {
      type = s.overrides.output;
    } else if (s.falcon || nx % qk != 0) {
      if (nx % qk != 0)
        note = t.name + ": row length " + std::to_string(nx) + " is not a multiple of " + std::to_string(qk) +
               " (" + type_name(type) + "); using q8_0";
      type = gt::Q8_0;
    } else if (type != gt::Q8_0) {
      type = gt::Q6_K;
    }
  } else if (cat == Category::TokenEmbd) {
    // no rule for our presets
  } else if (is_attn_v_like(cat)) {
    if (ft == ftype::Q2_K) {
      type = s.n_gqa >= 4 ? gt::Q4_K : gt::Q3_K;
    } else if (ft == ftype::Q3_K_M) {
      type = s.i_attention_wv < 2 ? gt::Q5_K : gt::Q4_K;
    } else if (ft == ftype::Q3_K_L) {
      type = gt::Q5_K;
    } else if ((ft == ftype::Q4_K_M || ft == ftype::Q5_K_M) && use_more_bits(s.i_attention_wv, s.n_attention_wv)) {
      type = gt::Q6_K;
    } else if (ft == ftype::Q4_K_S && s.i_attention_wv < 4) {
      type = gt::Q5_K;
    }
    if (s.is_70b && (type == gt::Q3_K || type == gt::Q4_K)) type = gt::Q5_K;
    if (n_expert == 8) type = gt::Q8_0;
    ++s.i_attention_wv;
  } else if (cat == Category::AttnK) {
    if (n_expert == 8) type = gt::Q8_0;
  } else if (cat == Category::AttnQ) {
    // only IQ presets have rules here
  } else if (cat == Category::FfnDown) {
    const int64_t i = layer_of(s, s.i_ffn_down, t.name), n = s.n_ffn_down;
    if (ft == ftype::Q2_K) {
      type = gt::Q3_K;
    } else if (ft == ftype::Q3_K_M) {
      type = i < n / 16 ? gt::Q5_K : (!s.falcon || use_more_bits(i, n)) ? gt::Q4_K : gt::Q3_K;
    } else if (ft == ftype::Q3_K_L) {
      type = s.falcon ? gt::Q4_K : gt::Q5_K;
    } else if (ft == ftype::Q4_K_M) {
      if (s.falcon)
        type = i < n / 16 ? gt::Q6_K : use_more_bits(i, n) ? gt::Q5_K : gt::Q4_K;
      else if (use_more_bits(i, n))
        type = gt::Q6_K;
    } else if (ft == ftype::Q5_K_M && use_more_bits(i, n)) {
      type = gt::Q6_K;
    } else if (ft == ftype::Q4_K_S && !s.falcon && i < n / 8) {
      type = gt::Q5_K;
    } else if ((ft == ftype::Q4_0 || ft == ftype::Q5_0) && s.has_imatrix && i < n / 8) {
      // llama.cpp guards the first ffn_down layers against "craziness" only with an imatrix
      type = ft == ftype::Q4_0 ? gt::Q4_1 : gt::Q5_1;
    }
    ++s.i_ffn_down;
  } else if (cat == Category::AttnOutput) {
    if (!s.falcon) {
      if (n_expert == 8) {
        if (ft == ftype::Q2_K || ft == ftype::Q3_K_S || ft == ftype::Q3_K_M || ft == ftype::Q4_K_S ||
            ft == ftype::Q4_K_M)
          type = gt::Q5_K;
      } else {
        if (ft == ftype::Q2_K) type = gt::Q3_K;
        else if (ft == ftype::Q3_K_M) type = gt::Q4_K;
        else if (ft == ftype::Q3_K_L) type = gt::Q5_K;
      }
    } else if (ft == ftype::Q3_K_L) {
      type = gt::Q4_K;
    }
  } else if (cat == Category::AttnQkv) {
    // unreachable: attn_qkv is attn_v-like and handled above (as in llama.cpp)
  } else if (cat == Category::FfnGate) {
    (void)layer_of(s, s.i_ffn_gate, t.name);  // only IQ3_XS changes the type; the check still applies
    ++s.i_ffn_gate;
  } else if (cat == Category::FfnUp) {
    (void)layer_of(s, s.i_ffn_up, t.name);
    ++s.i_ffn_up;
  }
  return type;
}

// tensor_type_fallback (table as of llama.cpp 007dbbf3fd17eefe9b47fee45f48f7ba5e62b714).
uint32_t shape_fallback_impl(const TensorDesc& t, uint32_t type, std::string& note) {
  const int64_t ncols = t.ne[0];
  const int64_t qk = block_size(type);
  if (ncols % qk == 0) return type;
  uint32_t fb;
  switch (type) {
    case gt::Q2_K:
    case gt::Q3_K: fb = gt::Q4_0; break;
    case gt::Q4_K: fb = gt::Q5_0; break;
    case gt::Q5_K: fb = gt::Q5_1; break;
    case gt::Q6_K: fb = gt::Q8_0; break;
    default:
      // llama.cpp defines no fallback for the legacy types and aborts; we keep
      // the tensor in F16 and say so, so that such models still convert.
      fb = gt::F16;
      break;
  }
  if (ncols % block_size(fb) != 0) fb = gt::F16;
  note = t.name + ": row length " + std::to_string(ncols) + " is not a multiple of " + std::to_string(qk) + " (" +
         type_name(type) + "); using " + type_name(fb);
  return fb;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      {"F32", ftype::ALL_F32, gt::F32},   {"F16", ftype::F16, gt::F16},       {"BF16", ftype::BF16, gt::BF16},
      {"Q8_0", ftype::Q8_0, gt::Q8_0},    {"Q6_K", ftype::Q6_K, gt::Q6_K},    {"Q5_K_S", ftype::Q5_K_S, gt::Q5_K},
      {"Q5_K_M", ftype::Q5_K_M, gt::Q5_K}, {"Q4_K_S", ftype::Q4_K_S, gt::Q4_K}, {"Q4_K_M", ftype::Q4_K_M, gt::Q4_K},
      {"Q3_K_S", ftype::Q3_K_S, gt::Q3_K}, {"Q3_K_M", ftype::Q3_K_M, gt::Q3_K}, {"Q3_K_L", ftype::Q3_K_L, gt::Q3_K},
      {"Q2_K", ftype::Q2_K, gt::Q2_K},    {"Q4_0", ftype::Q4_0, gt::Q4_0},    {"Q4_1", ftype::Q4_1, gt::Q4_1},
      {"Q5_0", ftype::Q5_0, gt::Q5_0},    {"Q5_1", ftype::Q5_1, gt::Q5_1},
  };
  return all;
}

const Preset& parse_preset(const std::string& name) {
  std::string want = upper(name);
  if (want == "Q3_K") want = "Q3_K_M";
  else if (want == "Q4_K") want = "Q4_K_M";
  else if (want == "Q5_K") want = "Q5_K_M";
  for (const Preset& p : presets())
    if (p.name == want) return p;
  std::string valid;
  for (const Preset& p : presets()) valid += (valid.empty() ? "" : ", ") + p.name;
  throw Error(ErrorKind::Usage,
              "unknown quantization preset '" + name + "'; valid: " + valid + " (aliases Q3_K, Q4_K, Q5_K)");
}

bool weight_name_less(const std::string& a, const std::string& b) {
  const int la = parse_block(a), lb = parse_block(b);
  if (la != lb) return la < lb;
  return a < b;
}

std::vector<std::string> sorted_tensor_order(std::vector<std::string> names) {
  std::stable_sort(names.begin(), names.end(), weight_name_less);
  return names;
}

uint32_t parse_tensor_type(const std::string& name, const std::string& flag) {
  // The types the converter writes: the presets' base types.
  std::vector<uint32_t> types;
  for (const Preset& p : presets())
    if (std::find(types.begin(), types.end(), p.base_type) == types.end()) types.push_back(p.base_type);
  std::string valid;
  for (uint32_t t : types) {
    const std::string n = type_name(t);
    if (n.size() == name.size() &&
        std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) { return std::tolower(a) == std::tolower(b); }))
      return t;
    valid += (valid.empty() ? "" : " ") + n;
  }
  throw Error(ErrorKind::Usage, flag + ": unknown tensor type '" + name + "' (one of " + valid + ")");
}

bool allows_quantization(const TensorDesc& t) { return allows_quantization_impl(t); }
uint32_t shape_fallback(const TensorDesc& t, uint32_t type, std::string& note) { return shape_fallback_impl(t, type, note); }

std::vector<TensorPlan> plan(const Preset& p, const ModelDesc& m, std::vector<TensorDesc> tensors, bool has_imatrix,
                             const TypeOverrides& overrides) {
  for (uint32_t o : {overrides.output, overrides.token_embd})
    if (o != kNoOverride && !ggml_type_info(o)) throw invalid_input(p.name, "unknown override type " + std::to_string(o));
  if (!ggml_type_info(p.base_type)) throw invalid_input(p.name, "unknown base type " + std::to_string(p.base_type));
  if (m.n_layer < 1) throw invalid_input("model", "n_layer must be at least 1, got " + std::to_string(m.n_layer));
  std::set<std::string> seen;
  for (const TensorDesc& t : tensors) {
    if (t.ne.empty()) throw invalid_input(t.name, "tensor has no dimensions");
    for (int64_t d : t.ne)
      if (d <= 0) throw invalid_input(t.name, "dimension " + std::to_string(d) + " is not positive");
    if (!seen.insert(t.name).second) throw invalid_input(t.name, "duplicate tensor name");
  }
  for (const auto& [name, type] : overrides.tensors)
    if (!seen.count(name)) throw invalid_input(name, "a per-tensor type for a tensor the model does not have");
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const TensorDesc& a, const TensorDesc& b) { return weight_name_less(a.name, b.name); });

  State s{p, m, overrides};
  s.has_imatrix = has_imatrix;
  s.falcon = m.arch == "falcon";
  s.n_gqa = m.n_head_kv > 0 ? m.n_head / m.n_head_kv : 0;
  s.is_70b = m.n_layer == 80 &&
             ((m.arch == "llama" && m.n_head != m.n_head_kv) || m.arch == "qwen2" || m.arch == "deci");
  // init_quantize_state_counters: counted over every tensor name.
  for (const TensorDesc& t : tensors) {
    const Category c = category_of(t.name);
    if (is_attn_v_like(c)) ++s.n_attention_wv;
    if (c == Category::Output) s.tied_embeddings = false;
  }
  s.n_ffn_down = s.n_ffn_gate = s.n_ffn_up = m.n_layer;

  const bool base_quantized = is_block_quantized(p.base_type);
  std::vector<TensorPlan> out;
  out.reserve(tensors.size());
  for (const TensorDesc& t : tensors) {
    TensorPlan tp;
    tp.name = t.name;
    if (!allows_quantization(t)) {
      tp.type = converter_type(t, p);
    } else if (!base_quantized) {
      tp.type = p.base_type;
    } else {
      uint32_t type = mix_type(s, p.base_type, t, category_of(t.name), tp.note);
      std::string fb_note;
      type = shape_fallback(t, type, fb_note);
      if (!fb_note.empty()) tp.note = fb_note;
      tp.type = type;
    }
    // llama-quantize sets these last, by exact name, with no fallback.
    const auto per_tensor = overrides.tensors.find(t.name);
    if (per_tensor != overrides.tensors.end() && !allows_quantization(t))
      throw invalid_input(t.name, std::string("a per-tensor type for a tensor llama.cpp never quantizes"));
    if (allows_quantization(t)) {
      const char* flag = nullptr;
      if (overrides.token_embd != kNoOverride && t.name == "token_embd.weight")
        tp.type = overrides.token_embd, flag = "--token-embedding-type";
      if (overrides.output != kNoOverride && t.name == "output.weight") tp.type = overrides.output, flag = "--output-tensor-type";
      if (per_tensor != overrides.tensors.end()) {
        if (!ggml_type_info(per_tensor->second) || !kquants::is_supported(per_tensor->second))
          throw invalid_input(t.name, "per-tensor type " + std::to_string(per_tensor->second) + " cannot be written");
        tp.type = per_tensor->second, flag = "the per-tensor type";
        tp.note.clear();
      }
      if (flag && t.ne[0] % block_size(tp.type) != 0)
        throw invalid_input(t.name, std::string(flag) + " " + type_name(tp.type) + ": the row length " +
                                        std::to_string(t.ne[0]) + " is not a multiple of its block size " +
                                        std::to_string(block_size(tp.type)));
    }
    tp.quantized = is_block_quantized(tp.type);
    out.push_back(std::move(tp));
  }
  return out;
}

}  // namespace qf::gguf_mix
