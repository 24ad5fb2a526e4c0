#include "checkpoint/pack.h"

#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace qf {
namespace {

void check_bits(int bits) {
  if (bits < 1 || bits > 8) throw invalid_input("pack", "bits must be 1..8, got " + std::to_string(bits));
}

void check_dims(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) throw invalid_input("pack", "negative dimensions");
}

// Packs n values read with stride `stride` into words written with stride `wstride`.
void pack_run(const uint8_t* v, int64_t n, int64_t stride, int bits, uint32_t* w, int64_t wstride) {
  const uint32_t mask = (1u << bits) - 1;
  const int64_t nw = packed_words(n, bits);
  for (int64_t k = 0; k < nw; ++k) w[k * wstride] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t x = v[i * stride];
    if (x > mask)
      throw invalid_input("pack", "value " + std::to_string(x) + " does not fit in " + std::to_string(bits) + " bits");
    const int64_t bit = i * bits;
    const int64_t word = bit >> 5;
    const int off = static_cast<int>(bit & 31);
    w[word * wstride] |= x << off;
    if (off + bits > 32) w[(word + 1) * wstride] |= x >> (32 - off);
  }
}

void unpack_run(const uint32_t* w, int64_t wstride, int64_t n, int bits, uint8_t* v, int64_t stride) {
  const uint32_t mask = (1u << bits) - 1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bit = i * bits;
    const int64_t word = bit >> 5;
    const int off = static_cast<int>(bit & 31);
    uint32_t x = w[word * wstride] >> off;
    if (off + bits > 32) x |= w[(word + 1) * wstride] << (32 - off);
    v[i * stride] = static_cast<uint8_t>(x & mask);
  }
}

}  // namespace

int64_t packed_words(int64_t n, int bits) { return (n * bits + 31) / 32; }

std::vector<int32_t> pack_int32_rows(const uint8_t* values, int64_t rows, int64_t cols, int bits) {
  check_bits(bits);
  check_dims(rows, cols);
  const int64_t nw = packed_words(cols, bits);
  std::vector<int32_t> out(static_cast<size_t>(rows * nw));
  auto* w = reinterpret_cast<uint32_t*>(out.data());
  for (int64_t r = 0; r < rows; ++r) pack_run(values + r * cols, cols, 1, bits, w + r * nw, 1);
  return out;
}

std::vector<uint8_t> unpack_int32_rows(const int32_t* words, int64_t rows, int64_t cols, int bits) {
  check_bits(bits);
  check_dims(rows, cols);
  const int64_t nw = packed_words(cols, bits);
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols));
  const auto* w = reinterpret_cast<const uint32_t*>(words);
  for (int64_t r = 0; r < rows; ++r) unpack_run(w + r * nw, 1, cols, bits, out.data() + r * cols, 1);
  return out;
}

std::vector<int32_t> pack_int32_cols(const uint8_t* values, int64_t rows, int64_t cols, int bits) {
  check_bits(bits);
  check_dims(rows, cols);
  std::vector<int32_t> out(static_cast<size_t>(packed_words(rows, bits) * cols));
  auto* w = reinterpret_cast<uint32_t*>(out.data());
  for (int64_t c = 0; c < cols; ++c) pack_run(values + c, rows, cols, bits, w + c, cols);
  return out;
}

std::vector<uint8_t> unpack_int32_cols(const int32_t* words, int64_t rows, int64_t cols, int bits) {
  check_bits(bits);
  check_dims(rows, cols);
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols));
  const auto* w = reinterpret_cast<const uint32_t*>(words);
  for (int64_t c = 0; c < cols; ++c) unpack_run(w + c, cols, rows, bits, out.data() + c, cols);
  return out;
}

std::vector<uint8_t> pack_nvfp4_rows(const QuantizedTensor& q) {
  std::vector<uint8_t> packed(q.q.size() / 2);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>((q.q[2 * i] & 0xf) | (q.q[2 * i + 1] << 4));
  return packed;
}

std::vector<uint8_t> nvfp4_scales_e4m3(const QuantizedTensor& q) {
  std::vector<uint8_t> sc(q.scales.size());
  for (size_t i = 0; i < sc.size(); ++i) sc[i] = f32_to_f8e4m3(q.scales[i]);
  return sc;
}

}  // namespace qf
