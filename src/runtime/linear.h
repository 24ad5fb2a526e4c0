// Linear: the one interface every weight matrix of the runtime goes through.
//
// A Linear maps x[n, in] to y[n, out] = x W^T (+ bias). Implementations keep
// the weight in its stored form (f32/f16/bf16 straight from the mmap here;
// packed integer groups, GGUF blocks, FP8 or FP4 in later formats) and decode
// it inside the kernel, a tile of rows at a time, so a quantized model is
// never rebuilt as an f16 model in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "quantizers/act_quant.h"
#include "quantizers/quant_scheme.h"

namespace qf::rt {

// A stored weight form a device can keep as it is and decode itself into a
// scratch matrix before each GEMM (runtime/device_runtime.h), pointing into
// the Linear's own storage (valid while the Linear lives).
struct DeviceWeightForm {
  enum class Kind { None, GgufBlocks, PackedInt, Fp8, Nvfp4 };
  Kind kind = Kind::None;
  // GgufBlocks: each row is row_bytes bytes of ggml blocks of `ggml_type`.
  uint32_t ggml_type = 0;
  const uint8_t* blocks = nullptr;
  size_t row_bytes = 0;
  // PackedInt: compressed-tensors' pack-quantized rows (codes of `bits`
  // bits, LSB first, words_per_row 32-bit words a row); value =
  // (code - zero) * scale of the element's group (strategy Group: column
  // c / group_size, or g_idx[c] when g_idx is given; Channel: one group per
  // row; Tensor: one for all).
  int bits = 0;
  QuantStrategy strategy = QuantStrategy::Group;
  int64_t group_size = 0, groups = 0, words_per_row = 0;
  const uint32_t* packed = nullptr;
  const float* scales = nullptr;
  const int32_t* zeros = nullptr;
  const int32_t* g_idx = nullptr;
  size_t n_scales = 0;
  // Fp8: one E4M3 code a weight in `blocks` (row-major), value = code *
  // scales[the weight's group, row or 0 as `strategy` says].
  // Nvfp4: two e2m1 codes a byte in `blocks` (element order, low nibble
  // first), value = code * e4m3(block_scales[row * groups + c / group_size])
  // / global_scale.
  const uint8_t* block_scales = nullptr;
  float global_scale = 0;
  size_t n_codes = 0;
};

class Linear {
 public:
  virtual ~Linear() = default;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  // y[t * out + j] = sum_i x[t * in + i] * W[j, i] (+ bias[j]) for t < n.
  // Each output element is computed by one thread in a fixed order, so the
  // result does not depend on the number of threads.
  virtual void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const = 0;

  // Row r of W decoded to f32 (in_features values): embedding lookups use it.
  virtual void decode_row(int64_t r, float* out) const = 0;
  // All of W decoded to f32, [out_features * in_features] row-major.
  std::vector<float> decode_all() const;

  // Bytes of weight data one full forward reads (for the bandwidth bound).
  virtual uint64_t weight_bytes() const = 0;

  // A short description of the stored form: "f16", "bf16", "q4_K", ...
  virtual std::string format() const = 0;

  // The bias (out_features values), empty when there is none.
  virtual std::vector<float> bias_values() const = 0;

  // The quantizer forward() applies to its input before the product (W8A8,
  // FP8 or NVFP4 activations); nullptr when the activations stay f32.
  virtual const ActQuantParams* input_quantizer() const { return nullptr; }

  // Whether the weight is stored quantized (integer groups, FP8, NVFP4, GGUF
  // blocks), as opposed to f32/f16/bf16.
  virtual bool quantized() const { return false; }

  // The weight in a form a device decodes itself (Kind::None: only decode_all).
  virtual DeviceWeightForm device_form() const { return {}; }

  // Gives the weight's pages back to the kernel when they are mapped from a
  // file (core/io.h, release_mapped_pages): they stop counting in resident
  // memory until read again. The Linear stays valid. Nothing for weights
  // held in memory.
  virtual void release_pages() const {}

 protected:
  Linear(int64_t in, int64_t out) : in_(in), out_(out) {}
  int64_t in_, out_;
};

// y[n, out] = x W^T (+ bias), kRowTile rows of W at a time across the pool:
// gemm(r0, rows) writes y[t * out + r0 + r] for every token t and r < rows
// (a gemm_tile_* call on the tile's rows); the bias is added after it.
constexpr int64_t kRowTile = 64;
using RowGemmFn = std::function<void(int64_t r0, int64_t rows)>;
void forward_row_gemm(int64_t n, float* y, int64_t out, const std::vector<float>& bias, ThreadPool& pool,
                      const RowGemmFn& gemm);

// For implementations that decode their weights to f32: forward_row_gemm
// with gemm_tile_f32. tile(r0, rows, buf) returns the f32 rows
// [r0, r0 + rows), decoded into buf (room for kRowTile * in floats) or
// pointing at weights already stored as f32.
using RowTileFn = std::function<const float*(int64_t r0, int64_t rows, float* buf)>;
void forward_row_tiles(const float* x, int64_t n, float* y, int64_t in, int64_t out, const std::vector<float>& bias,
                       ThreadPool& pool, const RowTileFn& tile);

// What stands in for a Linear whose weights were written to an output and
// released (quantize keeps one layer in memory): its shape, bias and
// format() stay; forward(), decode_row() and decode_all() are Internal
// errors naming it. Not a Linear a model can run.
std::unique_ptr<Linear> make_released_linear(int64_t in, int64_t out, std::vector<float> bias, std::string format,
                                             std::string name);

// `src` computed in bf16, as a model runs in bf16 on a GPU: its weight
// decoded once and rounded to bf16, each input row rounded to bf16, the
// products summed in f32 (cpu/bf16_gemm.h: VDPBF16PS where the CPU has
// AVX512-BF16, the same floats by f32 multiply-adds elsewhere); the bias
// added in f32. decode_row() and bias_values() are src's. For the bf16
// calibration path; a Linear with an input quantizer is an Internal error.
std::shared_ptr<Linear> make_bf16_linear(std::shared_ptr<const Linear> src);

// A bias as the Linear factories take it: an F32 tensor, or nullopt when
// `bias` is empty (pass `b ? &*b : nullptr`).
std::optional<Tensor> bias_tensor(const std::vector<float>& bias);

// A dense weight [out, in] in F32, F16 or BF16 (usually a zero-copy view of a
// mapped safetensors file) with an optional bias [out] of any float type.
// `name` is used in error messages.
std::unique_ptr<Linear> make_dense_linear(const Tensor& weight, const Tensor* bias, const std::string& name);

// A weight of `rows` x `cols` in a GGUF block type (Q4_0 ... Q6_K, Q8_0; see
// quantizers/kquants.h) kept in place in `data` (owned by `owner`). Below 16
// tokens each forward quantizes the activations to the type's dot-product
// format once per token, as llama.cpp does, then runs the block dot products;
// from 16 on it runs the f32-activation GEMM (docs/runtime.md). F32/F16/BF16
// GGUF tensors go through make_dense_linear instead.
//
// `regroup` (data itself, writable, or nullptr): Q8_0 rows are rewritten in
// place into groups of 16 interleaved rows (cpu/q8_0_groups.h) where the CPU
// has the kernel that reads them (q8_0_groups_fast()); every method reads the
// groups from then on, and device_form() is None (the device runtime widens
// such a weight to f32, so a model loaded for the device is not regrouped).
std::unique_ptr<Linear> make_block_linear(uint32_t ggml_type, const void* data, int64_t rows, int64_t cols,
                                          std::shared_ptr<const void> owner, const Tensor* bias,
                                          const std::string& name, uint8_t* regroup = nullptr);

// Integer groups (the canonical QuantizedTensor of quantizers/quant_scheme.h)
// kept packed at `bits` per weight; rows are decoded a tile at a time inside
// the kernel. Used for compressed-tensors pack-quantized and GPTQ checkpoints
// and for the layers a quantizer has just produced.
std::unique_ptr<Linear> make_packed_linear(const QuantizedTensor& q, const Tensor* bias, const std::string& name);

// Any quantized weight (integer groups, FP8, NVFP4) with its input quantizer
// (nullptr: weight-only, activations stay f32):
//   - int8 symmetric channel or tensor weights with int8 activations
//     (per-token dynamic, or static per-tensor symmetric or asymmetric): a
//     true int8 GEMM (cpu/int8_gemm.h: AVX-512 VNNI / AVX2 with a scalar
//     reference), int32 accumulation, the activation zero point removed with
//     the weight row sums, then the row and channel scales;
//   - otherwise the weight is decoded a tile at a time (integer codes, FP8
//     E4M3 and e2m1 through exact tables) and the activations are quantized
//     as the scheme says (quantize_activations) before an f32 GEMM, which is
//     exact emulation of the quantized product up to f32 summation order.
// format() reports the weight and the activation scheme ("int8 sym channel
// / int8 token dynamic"). Validates q and act (InvalidInput naming `name`).
std::unique_ptr<Linear> make_quantized_linear(const QuantizedTensor& q, const ActQuantParams* act, const Tensor* bias,
                                              const std::string& name);

}  // namespace qf::rt
