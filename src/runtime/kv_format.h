// KV-cache formats: the element type of the keys and of the values, the
// rotation applied before they are stored, and the layers kept in f16.
//
// Element types (per head vector of head_dim values; kv_codec.h has the
// layouts and docs/kv-cache.md the definitions and sources):
//   f16 f8 int8                      quantforge's own: IEEE half; OCP e4m3 over
//                                    a per-(layer, head) scale; int8 absmax/127
//                                    per vector with an f32 scale
//   q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl  llama.cpp's blocks of 32 (-ctk/-ctv), the
//                                    bytes of ggml's row converters
//   nvfp4                            e2m1 values, an e4m3 scale per 16 and a
//                                    per-(layer, K/V) global scale
//   kivi2 kivi4                      KIVI: keys per channel over 32-token
//                                    groups, values per token over 32-channel
//                                    groups, asymmetric, with the newest
//                                    positions kept in f16 (kKiviResidual)
//   turboquant_*                     vLLM's presets, as key/value pairs of the
//                                    TQ element types below, the first and
//                                    last two layers kept in f16
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qf::rt {

enum class KvDType {
  F16, F8_E4M3, I8,
  Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
  NVFP4,
  KIVI2, KIVI4,
  TQ_K8,     // TurboQuant FP8 keys
  TQ_K4_NC,  // TurboQuant 4-bit Lloyd-Max keys with norm correction
  TQ_K3_NC,  // 3-bit
  TQ_V4,     // TurboQuant uniform 4-bit values
  TQ_V3,
};

const char* kv_dtype_name(KvDType t);           // "f16", "q4_0", "kivi2", "tq_k3_nc", ...
// One element type by name: f16 (fp16), f8 (fp8, f8_e4m3), int8 (i8), q8_0,
// q4_0, q4_1, q5_0, q5_1, iq4_nl, nvfp4, kivi2, kivi4. Usage error otherwise
// (the TurboQuant types are reached through their presets only).
KvDType parse_kv_dtype(const std::string& s);

// llama.cpp's block types (q8_0 ... iq4_nl); KIVI's two types.
inline bool kv_is_block(KvDType t) {
  return t == KvDType::Q8_0 || t == KvDType::Q4_0 || t == KvDType::Q4_1 || t == KvDType::Q5_0 || t == KvDType::Q5_1 ||
         t == KvDType::IQ4_NL;
}
inline bool kv_is_kivi(KvDType t) { return t == KvDType::KIVI2 || t == KvDType::KIVI4; }
inline int kivi_bits(KvDType t) { return t == KvDType::KIVI2 ? 2 : 4; }

enum class KvRotation { None, Hadamard };

// Positions KIVI keeps in f16: up to this many newest (kivi.md: R = 128).
constexpr int64_t kKiviResidual = 128;
// Tokens per KIVI key group (and channels per value group).
constexpr int64_t kKiviGroup = 32;

struct KvFormat {
  KvDType k = KvDType::F16, v = KvDType::F16;
  // llama.cpp's rotation: an orthonormal Walsh-Hadamard transform of each
  // head vector of Q and K (and of V, with the output rotated back), applied
  // to the quantized element types only.
  KvRotation rotation = KvRotation::None;
  // Layers stored as f16 whatever k and v say: the first and the last
  // `keep_f16_edge` layers; -1: vLLM's TurboQuant rule, min(2, layers / 2)
  // (what the presets get unless --kv-f16-edge-layers says otherwise).
  int64_t keep_f16_edge = 0;
  std::string preset;  // "turboquant_k8v4", ... ("" for a plain k/v pair)

  KvFormat() = default;
  KvFormat(KvDType t) : k(t), v(t) {}  // NOLINT: one type for both

  KvDType k_at(int64_t layer, int64_t n_layers) const;
  KvDType v_at(int64_t layer, int64_t n_layers) const;
  bool has_kivi() const;
  // "q4_0", "k=q8_0,v=q4_0", "turboquant_k3v4_nc", with "+hadamard" when
  // rotated and "+edgeN" when a preset's edge layers are set by hand.
  std::string name() const;
  // The flag values that select it: vLLM's --kv-cache-dtype and llama.cpp's
  // -ctk/-ctv ("" when that engine has no such cache: a TurboQuant preset
  // with its edge layers set by hand, a rotation of a head llama.cpp does
  // not rotate (head_dim not divisible by 64)).
  std::string vllm_flag() const;
  std::string llama_cpp_flags(int64_t head_dim) const;
};

bool operator==(const KvFormat& a, const KvFormat& b);
inline bool operator!=(const KvFormat& a, const KvFormat& b) { return !(a == b); }

// The format for --kv-dtype D (both, or a TurboQuant preset), --kv-k-dtype K
// and --kv-v-dtype V (each overriding one side; "" when not given), and
// --kv-rotation (none, hadamard). Usage error for an unknown name, a preset
// mixed with -k/-v types or a rotation, and a rotation with no quantized side.
// --kv-f16-edge-layers (-1: the preset's rule; only with a preset). The
// rotation applies to llama.cpp's block types only (q8_0 ... iq4_nl), at
// least one side quantized.
KvFormat parse_kv_format(const std::string& both, const std::string& k = "", const std::string& v = "",
                         const std::string& rotation = "none", int64_t f16_edge = -1);

// A format by the name KvFormat::name() gives it ("q4_0+hadamard",
// "k=q8_0,v=q4_0", "turboquant_3bit_nc+edge0", or a plain type or preset).
KvFormat parse_kv_format_name(const std::string& name);

// Every format the sweep measures, in its order, for a model of n_layers:
// the presets with vLLM's rule, and also with every layer compressed when
// that rule leaves none (models of 4 layers or fewer).
std::vector<KvFormat> kv_sweep_formats(int64_t n_layers = 32);

// Whether a head of `head_dim` can use `t` ("" when it can, else why).
std::string kv_dtype_fits(KvDType t, int64_t head_dim);

}  // namespace qf::rt
