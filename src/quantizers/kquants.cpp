// Quantization and dequantization of the GGUF block types, by type: each
// type's code is in its kquant_<type>.cpp (kquant_impl.h lists them).
#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file
#include "quantizers/kquants.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace qf::kquants {
namespace {

using namespace detail;

// One call of the shared block decoder (kquant_blocks.h) per block.
template <class Block>
void dequantize_blocks(const void* src, float* y, int64_t nb, int block_size) {
  const auto* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < nb; ++i, y += block_size) dequantize_block(b[i], y);
}

// ---- checks ------------------------------------------------------------------

const GgmlTypeInfo& checked_info(uint32_t type, const char* where) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (!info || !is_supported(type))
    throw unsupported(where, std::string("ggml type ") + (info ? info->name : std::to_string(type)) +
                                 " is not supported (supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, "
                                 "q8_1, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K, iq4_nl)");
  return *info;
}

int64_t checked_blocks(uint32_t type, int64_t n, const char* where) {
  const GgmlTypeInfo& info = checked_info(type, where);
  if (n < 0 || n % info.block_size != 0)
    throw invalid_input(where, std::string(info.name) + " row length " + std::to_string(n) +
                                   " is not a multiple of the block size " + std::to_string(info.block_size));
  return n / info.block_size;
}

}  // namespace

bool is_supported(uint32_t type) {
  namespace t = ggml_type;
  switch (type) {
    case t::F32: case t::F16: case t::BF16: case t::Q4_0: case t::Q4_1: case t::Q5_0: case t::Q5_1:
    case t::Q8_0: case t::Q8_1: case t::Q2_K: case t::Q3_K: case t::Q4_K: case t::Q5_K: case t::Q6_K:
    case t::Q8_K: case t::IQ4_NL:
      return true;
    default:
      return false;
  }
}

size_t row_size(uint32_t type, int64_t n) {
  const int64_t nb = checked_blocks(type, n, "row_size");
  return static_cast<size_t>(nb) * ggml_type_info(type)->type_size;
}

void quantize_rows(uint32_t type, const float* src, void* dst, int64_t nrows, int64_t n_per_row, const float* imatrix) {
  namespace t = ggml_type;
  const int64_t nb = checked_blocks(type, n_per_row, "quantize_rows");
  if (type == t::Q8_1 || type == t::Q8_K)
    throw unsupported("quantize_rows", std::string(ggml_type_info(type)->name) +
                                           " is an activation type (use quantize_activation)");
  if (nrows < 0) throw invalid_input("quantize_rows", "negative row count " + std::to_string(nrows));
  const size_t rs = static_cast<size_t>(nb) * ggml_type_info(type)->type_size;
  for (int64_t r = 0; r < nrows; ++r) {
    const float* x = src + r * n_per_row;
    void* y = static_cast<uint8_t*>(dst) + static_cast<size_t>(r) * rs;
    const float* qw = imatrix;
    switch (type) {
      case t::F32: std::memcpy(y, x, static_cast<size_t>(n_per_row) * 4); break;
      case t::F16: {
        auto* o = static_cast<uint16_t*>(y);
        for (int64_t j = 0; j < n_per_row; ++j) o[j] = f32_to_f16(x[j]);
        break;
      }
      case t::BF16: {
        auto* o = static_cast<uint16_t*>(y);
        for (int64_t j = 0; j < n_per_row; ++j) o[j] = f32_to_bf16(x[j]);
        break;
      }
      case t::Q4_0: qw ? quant_q4_0_w(x, static_cast<BlockQ4_0*>(y), n_per_row, qw) : quant_q4_0(x, static_cast<BlockQ4_0*>(y), nb); break;
      case t::Q4_1: qw ? quant_q4_1_w(x, static_cast<BlockQ4_1*>(y), n_per_row, qw) : quant_q4_1(x, static_cast<BlockQ4_1*>(y), nb); break;
      case t::Q5_0: qw ? quant_q5_0_w(x, static_cast<BlockQ5_0*>(y), n_per_row, qw) : quant_q5_0(x, static_cast<BlockQ5_0*>(y), nb); break;
      case t::Q5_1: qw ? quant_q5_1_w(x, static_cast<BlockQ5_1*>(y), n_per_row, qw) : quant_q5_1(x, static_cast<BlockQ5_1*>(y), nb); break;
      case t::Q8_0: quant_q8_0(x, static_cast<BlockQ8_0*>(y), nb); break;
      case t::Q2_K: qw ? quant_q2_k_w(x, static_cast<BlockQ2_K*>(y), nb, qw) : quant_q2_k(x, static_cast<BlockQ2_K*>(y), nb); break;
      case t::Q3_K: qw ? quant_q3_k_w(x, static_cast<BlockQ3_K*>(y), nb, qw) : quant_q3_k(x, static_cast<BlockQ3_K*>(y), nb); break;
      case t::Q4_K: quant_q4_k(x, static_cast<BlockQ4_K*>(y), nb, qw); break;
      case t::Q5_K: quant_q5_k(x, static_cast<BlockQ5_K*>(y), nb, qw); break;
      case t::Q6_K: quant_q6_k(x, static_cast<BlockQ6_K*>(y), nb, qw); break;
      case t::IQ4_NL: quant_iq4_nl(x, static_cast<BlockIQ4_NL*>(y), nb, qw, 7); break;
      default: throw Error(ErrorKind::Internal, "quantize_rows: unhandled type");
    }
  }
}

void quantize_row_iq4_nl_ref(const float* src, void* dst, int64_t n) {
  const int64_t nb = checked_blocks(ggml_type::IQ4_NL, n, "quantize_row_iq4_nl_ref");
  quant_iq4_nl(src, static_cast<BlockIQ4_NL*>(dst), nb, nullptr, -1);
}

void dequantize_row(uint32_t type, const void* src, float* y, int64_t n) {
  namespace t = ggml_type;
  const int64_t nb = checked_blocks(type, n, "dequantize_row");
  switch (type) {
    case t::F32: std::memcpy(y, src, static_cast<size_t>(n) * 4); break;
    case t::F16: for (int64_t j = 0; j < n; ++j) y[j] = f16_to_f32(static_cast<const uint16_t*>(src)[j]); break;
    case t::BF16: for (int64_t j = 0; j < n; ++j) y[j] = bf16_to_f32(static_cast<const uint16_t*>(src)[j]); break;
    case t::Q4_0: dequantize_blocks<BlockQ4_0>(src, y, nb, QK); break;
    case t::Q4_1: dequantize_blocks<BlockQ4_1>(src, y, nb, QK); break;
    case t::Q5_0: dequantize_blocks<BlockQ5_0>(src, y, nb, QK); break;
    case t::Q5_1: dequantize_blocks<BlockQ5_1>(src, y, nb, QK); break;
    case t::Q8_0: dequantize_blocks<BlockQ8_0>(src, y, nb, QK); break;
    case t::Q8_1: dequantize_blocks<BlockQ8_1>(src, y, nb, QK); break;
    case t::Q2_K: dequantize_blocks<BlockQ2_K>(src, y, nb, QK_K); break;
    case t::Q3_K: dequantize_blocks<BlockQ3_K>(src, y, nb, QK_K); break;
    case t::Q4_K: dequantize_blocks<BlockQ4_K>(src, y, nb, QK_K); break;
    case t::Q5_K: dequantize_blocks<BlockQ5_K>(src, y, nb, QK_K); break;
    case t::Q6_K: dequantize_blocks<BlockQ6_K>(src, y, nb, QK_K); break;
    case t::Q8_K: dequantize_blocks<BlockQ8_K>(src, y, nb, QK_K); break;
    case t::IQ4_NL: dequantize_blocks<BlockIQ4_NL>(src, y, nb, QK); break;
    default: throw Error(ErrorKind::Internal, "dequantize_row: unhandled type");
  }
}

uint32_t vec_dot_type(uint32_t type) {
  namespace t = ggml_type;
  checked_info(type, "vec_dot_type");
  switch (type) {
    case t::Q4_0: case t::Q5_0: case t::Q8_0: case t::IQ4_NL: return t::Q8_0;
    case t::Q4_1: case t::Q5_1: return t::Q8_1;
    case t::Q2_K: case t::Q3_K: case t::Q4_K: case t::Q5_K: case t::Q6_K: return t::Q8_K;
    case t::F32: case t::F16: case t::BF16: return type;
    default:
      throw unsupported("vec_dot_type", std::string(ggml_type_info(type)->name) + " is an activation type, not a weight type");
  }
}

void quantize_activation(uint32_t type, const float* x, void* dst, int64_t n) {
  namespace t = ggml_type;
  const int64_t nb = checked_blocks(type, n, "quantize_activation");
  switch (type) {
    case t::Q8_0: quant_q8_0(x, static_cast<BlockQ8_0*>(dst), nb); break;
    case t::Q8_1: quant_q8_1(x, static_cast<BlockQ8_1*>(dst), nb); break;
    case t::Q8_K: quant_q8_k(x, static_cast<BlockQ8_K*>(dst), nb); break;
    case t::F32: case t::F16: case t::BF16: quantize_rows(type, x, dst, 1, n, nullptr); break;
    default:
      throw unsupported("quantize_activation", std::string(ggml_type_info(type)->name) +
                                                   " is not an activation type (use q8_0, q8_1, q8_K, f32, f16 or bf16)");
  }
}

}  // namespace qf::kquants
