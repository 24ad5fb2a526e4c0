// QuantScheme and QuantizedTensor: the one canonical form of an integer
// weight quantization that every quantizer produces (RTN, GPTQ, ...), every
// exporter packs (compressed-tensors, GPTQ, AWQ) and the runtime reads.
//
// Conventions (compressed-tensors' and GPTQ's, in one form):
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
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qf {

enum class QuantStrategy { Tensor, Channel, Group };
const char* strategy_name(QuantStrategy s);  // "tensor", "channel", "group"

struct QuantScheme {
  int bits = 4;                               // 2..8
  bool symmetric = true;
  QuantStrategy strategy = QuantStrategy::Group;
  int64_t group_size = 128;                   // strategy Group only
  DType scale_dtype = DType::F16;

  static QuantScheme make(int bits, bool symmetric, QuantStrategy strategy, int64_t group_size = 128,
                          DType scale_dtype = DType::F16) {
    return QuantScheme{bits, symmetric, strategy, group_size, scale_dtype};
  }

  int32_t qmax() const { return (1 << bits) - 1; }
  int32_t sym_zero() const { return 1 << (bits - 1); }
  // "int4 sym g128", "int8 asym channel", ...
  std::string describe() const;
  // Throws qf::Error (InvalidInput) naming `where` for bits outside 2..8, a
  // group size < 1, or (when cols > 0) a group size that does not divide cols.
  void validate(const std::string& where, int64_t cols = 0) const;
};

struct QuantizedTensor {
  QuantScheme scheme;
  int64_t rows = 0, cols = 0;       // [out, in] of the Linear
  std::vector<uint8_t> q;           // [rows * cols] codes
  std::vector<float> scales;        // [rows * n_groups()], already rounded to scheme.scale_dtype
  std::vector<int32_t> zeros;       // [rows * n_groups()]
  std::vector<int32_t> g_idx;       // [cols] group of each input column; empty: identity (col / group_size)

  int64_t n_groups() const;         // 1 for tensor, 1 per row for channel, ceil(cols / group_size) for group
  int64_t group_of(int64_t col) const;
  // Index into scales/zeros for (row, group). Tensor strategy shares entry 0.
  int64_t param_index(int64_t row, int64_t group) const;
  void dequantize_row(int64_t r, float* out) const;
  std::vector<float> dequantize() const;  // [rows * cols]
  // Checks sizes and ranges; throws InvalidInput naming `where`.
  void validate(const std::string& where) const;
};

}  // namespace qf
