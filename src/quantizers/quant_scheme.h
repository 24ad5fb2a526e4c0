// QuantScheme and QuantizedTensor: the one canonical form of a weight
// quantization that every quantizer produces (RTN, GPTQ, AWQ, FP8, NVFP4),
// every exporter writes (compressed-tensors, GPTQ, AWQ, modelopt) and the
// runtime reads.
//
// Integer schemes (type Int), compressed-tensors' and GPTQ's conventions in one form:
//   - codes are unsigned, q in [0, 2^bits - 1]; zero points are unsigned too,
//     z in [0, 2^bits - 1]; a weight decodes as w = (q - z) * scale;
//   - symmetric schemes have z = 2^(bits-1) everywhere (compressed-tensors'
//     signed q - 2^(bits-1) with no zero point; GPTQ's qzeros of 2^(bits-1));
//   - scales are rounded to `scale_dtype` (the model's dtype, as the exporters
//     store them) before the codes are computed, so that what is exported is
//     exactly what was optimised;
//   - strategy tensor: one group for the whole matrix; channel: one per output
//     row; group: one per `group_size` input columns of each row, the column's
//     group given by g_idx (identity order i / group_size unless act-order
//     with g_idx reorders it).
//
// Float schemes (type Float), as compressed-tensors defines them:
//   - bits 8: FP8 E4M3 codes (the OCP byte, core/dtype.h), strategy tensor,
//     channel or group; w = e4m3(q) * scale, scale = amax / 448 rounded to
//     scale_dtype;
//   - bits 4: NVFP4, strategy tensor_group with group_size 16: codes are
//     e2m1 nibbles (sign in bit 3), each 16-column block has an e4m3 scale
//     (stored here decoded to f32; scale_dtype F8_E4M3), and the tensor has a
//     global scale in compressed-tensors' multiplier convention,
//     global_scale = 448 * 6 / amax, so w = e2m1(q) * scale / global_scale
//     (modelopt's weight_scale_2 is its reciprocal);
//   - zeros is empty (float schemes are symmetric).
//
// bitsandbytes 4-bit schemes (type Nf4 or Fp4; quantizers/bnb4.h):
//   - codes are indices 0..15 into bitsandbytes' NF4 or FP4 table, strategy
//     group with group_size 64 (bitsandbytes' blocksize); the blocks run over
//     the row-major flattened [rows, cols] weight, as bitsandbytes flattens
//     it, so a block may cross a row end and the last may be short; there
//     are ceil(rows * cols / 64) of them;
//   - scales are each block's absmax as f32 (with double_quant: the absmax
//     decoded from its 8-bit code, f32(f32(map[code] * nested) + offset));
//   - a weight decodes as round_to(scale_dtype, table[q] * absmax): bitsandbytes
//     dequantizes to the dtype of its quant_state (the model dtype), which is
//     what scale_dtype holds here;
//   - with double_quant, absmax_codes / nested_absmax / absmax_offset hold
//     the stored form of the scales (bitsandbytes' compress_statistics).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qf {

enum class QuantType { Int, Float, Nf4, Fp4 };
const char* quant_type_name(QuantType t);  // "int", "float", "nf4", "fp4"

// Token is an activation strategy only (one scale per row of x).
enum class QuantStrategy { Tensor, Channel, Group, TensorGroup, Token };
const char* strategy_name(QuantStrategy s);  // "tensor", "channel", "group", "tensor_group", "token"

struct QuantScheme {
  int bits = 4;                               // 2..8
  bool symmetric = true;
  QuantStrategy strategy = QuantStrategy::Group;
  int64_t group_size = 128;                   // strategy Group only
  DType scale_dtype = DType::F16;
  QuantType type = QuantType::Int;
  bool double_quant = false;                  // Nf4/Fp4 only: absmax stored as 8-bit codes (bitsandbytes' nested state)

  static QuantScheme make(int bits, bool symmetric, QuantStrategy strategy, int64_t group_size = 128,
                          DType scale_dtype = DType::F16) {
    return QuantScheme{bits, symmetric, strategy, group_size, scale_dtype, QuantType::Int, false};
  }
  // FP8 E4M3 weights, tensor or channel (or group) scales stored in scale_dtype
  // (compressed-tensors: the model dtype; modelopt: f32).
  static QuantScheme fp8(QuantStrategy strategy, DType scale_dtype = DType::F32, int64_t group_size = 128) {
    return QuantScheme{8, true, strategy, group_size, scale_dtype, QuantType::Float, false};
  }
  // NVFP4: e2m1, 16-element blocks, e4m3 block scales, f32 global scale.
  static QuantScheme nvfp4() { return QuantScheme{4, true, QuantStrategy::TensorGroup, 16, DType::F8_E4M3, QuantType::Float, false}; }
  // bitsandbytes NF4 / FP4: blocks of 64 over the flattened weight, f32 absmax;
  // `dtype`: the dtype bitsandbytes dequantizes to (the model's).
  static QuantScheme bnb4(QuantType t, bool double_quant = false, DType dtype = DType::F16) {
    return QuantScheme{4, true, QuantStrategy::Group, 64, dtype, t, double_quant};
  }

  bool is_float() const { return type == QuantType::Float; }
  bool is_fp8() const { return type == QuantType::Float && bits == 8; }
  bool is_nvfp4() const { return type == QuantType::Float && bits == 4; }
  bool is_bnb4() const { return type == QuantType::Nf4 || type == QuantType::Fp4; }
  bool is_int() const { return type == QuantType::Int; }
  bool grouped() const { return strategy == QuantStrategy::Group || strategy == QuantStrategy::TensorGroup; }
  // Largest code: 2^bits - 1 (for float types: the largest byte / nibble).
  int32_t qmax() const { return (1 << bits) - 1; }
  int32_t sym_zero() const { return 1 << (bits - 1); }
  // "int4 sym g128", "int8 asym channel", "fp8 channel", "nvfp4", ...
  std::string describe() const;
  // Throws qf::Error (InvalidInput) naming `where` for bits outside 2..8, a
  // group size < 1, (when cols > 0) a group size that does not divide cols,
  // the token strategy, or a float scheme other than FP8 (tensor, channel,
  // group) and NVFP4 (tensor_group, 16).
  void validate(const std::string& where, int64_t cols = 0) const;
};

struct QuantizedTensor {
  QuantScheme scheme;
  int64_t rows = 0, cols = 0;       // [out, in] of the Linear
  std::vector<uint8_t> q;           // [rows * cols] codes
  std::vector<float> scales;        // [rows * n_groups()], already rounded to scheme.scale_dtype
  std::vector<int32_t> zeros;       // [rows * n_groups()]; empty for float schemes
  std::vector<int32_t> g_idx;       // [cols] group of each input column; empty: identity (col / group_size)
  float global_scale = 0;           // tensor_group (NVFP4) only: 448 * 6 / amax (multiplier convention)
  // bitsandbytes double quantization (scheme.double_quant): one 8-bit code per
  // absmax (index into bnb_dynamic_map()), one f32 absmax per 256 of them, the
  // mean subtracted first. scales holds what they decode to.
  std::vector<uint8_t> absmax_codes;
  std::vector<float> nested_absmax;
  float absmax_offset = 0;

  // 1 for tensor, 1 per row for channel, ceil(cols / group_size) for group and tensor_group
  // (not for bitsandbytes schemes, whose blocks are over the flattened weight)
  int64_t n_groups() const;
  // Entries of scales (and zeros): 1 for tensor, rows * n_groups() otherwise;
  // bitsandbytes: ceil(rows * cols / 64).
  int64_t n_params() const;
  int64_t group_of(int64_t col) const;
  // Index into scales/zeros for (row, group). Tensor strategy shares entry 0.
  int64_t param_index(int64_t row, int64_t group) const;
  void dequantize_row(int64_t r, float* out) const;
  std::vector<float> dequantize() const;  // [rows * cols]
  // Checks sizes and ranges (NVFP4: block scales exact non-negative e4m3
  // values, a positive global scale); throws InvalidInput naming `where`.
  void validate(const std::string& where) const;
};

}  // namespace qf
