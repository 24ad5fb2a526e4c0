// The pieces the vision towers are built of, in f32 on the CPU: weights read
// from the checkpoint with their shapes checked, Linear layers over the
// runtime's register-blocked f32 GEMM tiles, LayerNorm/RMSNorm, activations
// and multi-head attention. Every product is split into fixed tiles whose
// boundaries depend only on the sizes, so results are the same whatever the
// thread count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "core/thread_pool.h"

#include "formats/hf/model_config.h"
#include "quantizers/act_quant.h"

namespace qf {
class Checkpoint;
class CheckpointFormat;
}

namespace qf::rt::vision {

// Reads a checkpoint's vision tensors by working name (formats/hf/
// model_tensors.h, apply_hf_tensor_naming), widened to f32. `where` (the
// model folder) prefixes messages. With a quantization_config in `cfg`, its
// format (checkpoint/checkpoint_format.h) reads the Linears it stores
// quantized (a vision side quantized by the recipe's `vision:` section).
class VisionTensors {
 public:
  VisionTensors(const ModelConfig& cfg, const Checkpoint& ck, std::string where);
  // The tensor `name` with exactly `shape`: NotFound naming it when absent,
  // InvalidInput naming it and both shapes when its shape differs (`why`
  // says which config keys imply the expected one), Unsupported for a dtype
  // that is not f32, f16 or bf16 (a quantized vision tower).
  std::vector<float> get(const std::string& name, const Shape& shape, const std::string& why) const;
  // The same checks without reading the values, for a tensor the tower does
  // not use (a layer past the selected feature layer, CLIP's
  // post_layernorm): nothing when it is absent.
  void check_if_present(const std::string& name, const Shape& shape, const std::string& why) const;
  bool has(const std::string& name) const;
  const Checkpoint& checkpoint() const { return ck_; }
  const std::string& where() const { return where_; }
  const CheckpointFormat* format() const { return format_; }  // nullptr: not quantized
  const nlohmann::json& quantization_config() const { return qcfg_; }

 private:
  const Checkpoint& ck_;
  std::string where_;
  const CheckpointFormat* format_ = nullptr;
  nlohmann::json qcfg_;  // as the format reads it (CheckpointFormat::open)
};

// InvalidInput when a tensor of the checkpoint starts with `prefix` followed
// by a layer index >= `layers` (a block the config does not describe):
// names the tensor and `config_key`.
void check_layer_count(const Checkpoint& ck, const std::string& prefix, int64_t layers, const std::string& where,
                       const std::string& config_key);

// y[n, out] = x[n, in] W^T + b, W row-major [out, in] in f32. A Linear
// stored quantized holds its decoded weight, and its input quantizer when
// the scheme quantizes inputs (applied to x first, as the language model's
// Linears do: quantizers/act_quant.h).
struct DenseLinear {
  int64_t in = 0, out = 0;
  std::vector<float> w, b;  // b empty: no bias
  std::optional<ActQuantParams> act;
};
DenseLinear load_linear(const VisionTensors& t, const std::string& prefix, int64_t out, int64_t in, bool bias,
                        const std::string& why);
void linear_forward(const DenseLinear& l, const float* x, int64_t n, float* y, ThreadPool& pool);

// Row-wise normalisations of x [n, d] into y (may alias x): LayerNorm
// (mean and variance accumulated in double), RMSNorm (w only).
struct Norm {
  std::vector<float> w, b;  // b empty for RMSNorm
  float eps = 1e-6f;
};
Norm load_layer_norm(const VisionTensors& t, const std::string& prefix, int64_t d, float eps, const std::string& why);
Norm load_rms_norm(const VisionTensors& t, const std::string& prefix, int64_t d, float eps, const std::string& why);
void layer_norm_rows(const Norm& nrm, const float* x, int64_t n, int64_t d, float* y);
void rms_norm_rows(const Norm& nrm, const float* x, int64_t n, int64_t d, float* y);

// transformers' ACT2FN names the towers use.
enum class Activation { QuickGelu, Gelu, GeluTanh, Silu };
// Unsupported naming `where` and `key` for another name.
Activation parse_activation(const std::string& name, const std::string& where, const std::string& key);
void activate(Activation a, float* x, int64_t n);

// Multi-head attention without masking inside each segment
// [segments[i], segments[i + 1]) of the n rows: q, k and v are row-major with
// row stride `ld`, head h in columns [h * head_dim, (h + 1) * head_dim);
// out [n, heads * head_dim]. softmax(q k^T * scale) v in f32.
void attention(const float* q, const float* k, const float* v, int64_t ld, int64_t n, int64_t heads,
               int64_t head_dim, float scale, const std::vector<int64_t>& segments, float* out, ThreadPool& pool);

// vision_config readers: the value of `key` (or `fallback` when absent or
// null), InvalidInput naming `where` and the key when it has the wrong type
// or is not positive.
int64_t config_int(const nlohmann::json& vc, const std::string& key, int64_t fallback, const std::string& where);
double config_number(const nlohmann::json& vc, const std::string& key, double fallback, const std::string& where);
std::string config_string(const nlohmann::json& vc, const std::string& key, const std::string& fallback,
                          const std::string& where);

}  // namespace qf::rt::vision
