#include "quantizers/bnb4.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qf {

std::array<float, 16> bnb4_quant_map(QuantType t) {
  if (t != QuantType::Nf4 && t != QuantType::Fp4) throw invalid_input("bitsandbytes", "not a 4-bit bitsandbytes type");
  std::array<float, 16> m{};
  for (int i = 0; i < 16; ++i) m[static_cast<size_t>(i)] = hd::bnb4_value(t == QuantType::Fp4, static_cast<uint8_t>(i));
  // get_4bit_type("fp4") lists code 8 as the Python integer -0, which is
  // +0.0 in the stored table (the kernel itself decodes code 8 to -0.0).
  if (t == QuantType::Fp4) m[8] = 0.0f;
  return m;
}

const std::array<float, 256>& bnb_dynamic_map() {
  static const std::array<float, 256> map = [] {
    // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    // for i in 0..6, 2^i + 1 boundaries linspace(0.1, 1) in f32, their
    // midpoints in f32, times 10^(i - 6) (Python floats), both signs; then 0
    // and 1; sorted; torch.tensor(..., float32).
    std::vector<double> data;
    for (int i = 0; i < 7; ++i) {
      const int64_t steps = (int64_t{1} << i) + 1;
      const float start = 0.1f, end = 1.0f;
      const float step = (end - start) / static_cast<float>(steps - 1);
      const int64_t halfway = steps / 2;
      std::vector<float> b(static_cast<size_t>(steps));
      for (int64_t k = 0; k < steps; ++k)
        b[static_cast<size_t>(k)] = k < halfway ? start + step * static_cast<float>(k)
                                                : end - step * static_cast<float>(steps - k - 1);
      const double p = std::pow(10.0, static_cast<double>(i - 6));
      for (int64_t k = 0; k + 1 < steps; ++k) {
        const float mean = (b[static_cast<size_t>(k)] + b[static_cast<size_t>(k + 1)]) / 2.0f;
        data.push_back(p * static_cast<double>(mean));
        data.push_back(-p * static_cast<double>(mean));
      }
    }
    data.push_back(0.0);
    data.push_back(1.0);
    std::sort(data.begin(), data.end());
    std::array<float, 256> m{};
    for (size_t i = 0; i < 256; ++i) m[i] = static_cast<float>(data.at(i));
    return m;
  }();
  return map;
}

std::vector<float> bnb_decode_absmax(const std::vector<uint8_t>& codes, const std::vector<float>& nested, float offset) {
  const auto& map = bnb_dynamic_map();
  std::vector<float> out(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    const float v = map[codes[i]] * nested.at(i / static_cast<size_t>(kBnbNestedBlock));
    out[i] = v + offset;
  }
  return out;
}

void bnb_double_quant(const std::vector<float>& absmax, QuantizedTensor& q) {
  const size_t n = absmax.size();
  double sum = 0;
  for (float a : absmax) sum += a;
  const float offset = n ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f;
  const auto& map = bnb_dynamic_map();
  q.absmax_codes.assign(n, 0);
  q.nested_absmax.clear();
  for (size_t b0 = 0; b0 < n; b0 += static_cast<size_t>(kBnbNestedBlock)) {
    const size_t b1 = std::min(n, b0 + static_cast<size_t>(kBnbNestedBlock));
    float m = 0;
    for (size_t i = b0; i < b1; ++i) m = std::max(m, std::fabs(absmax[i] - offset));
    q.nested_absmax.push_back(m);
    const float r = 1.0f / m;
    for (size_t i = b0; i < b1; ++i) q.absmax_codes[i] = hd::bnb_dynamic_code(map.data(), (absmax[i] - offset) * r);
  }
  q.absmax_offset = offset;
  q.scales = bnb_decode_absmax(q.absmax_codes, q.nested_absmax, offset);
}

QuantizedTensor quantize_bnb4(const float* w, int64_t rows, int64_t cols, const QuantScheme& s) {
  if (!s.is_bnb4()) throw invalid_input("quantize_bnb4", "needs an NF4 or FP4 scheme, got " + s.describe());
  QuantizedTensor q;
  q.scheme = s;
  q.rows = rows;
  q.cols = cols;
  const int64_t n = rows * cols, bs = s.group_size;
  const bool fp4 = s.type == QuantType::Fp4;
  q.q.resize(static_cast<size_t>(n));
  std::vector<float> absmax(static_cast<size_t>((n + bs - 1) / bs));
  for (int64_t b = 0; b * bs < n; ++b) {
    const int64_t e0 = b * bs, e1 = std::min(n, e0 + bs);
    float m = 0;
    for (int64_t e = e0; e < e1; ++e) m = std::max(m, std::fabs(w[e]));
    absmax[static_cast<size_t>(b)] = m;
    const float r = 1.0f / m;  // inf for an all-zero block: every code then comes from NaN, as in the kernel
    for (int64_t e = e0; e < e1; ++e) q.q[static_cast<size_t>(e)] = hd::bnb4_code(fp4, w[e] * r);
  }
  if (s.double_quant) {
    bnb_double_quant(absmax, q);
  } else {
    q.scales = std::move(absmax);
  }
  return q;
}

std::vector<uint8_t> pack_bnb4(const std::vector<uint8_t>& codes, QuantType t) {
  const uint8_t zero = hd::bnb4_code(t == QuantType::Fp4, 0.0f);
  std::vector<uint8_t> p((codes.size() + 1) / 2);
  for (size_t i = 0; i < p.size(); ++i) {
    const uint8_t hi = codes[2 * i] & 15u;
    const uint8_t lo = 2 * i + 1 < codes.size() ? codes[2 * i + 1] & 15u : zero;
    p[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return p;
}

std::vector<uint8_t> unpack_bnb4(const uint8_t* packed, size_t n_bytes, int64_t n) {
  if (n < 0 || static_cast<size_t>((n + 1) / 2) != n_bytes)
    throw invalid_input("bitsandbytes", std::to_string(n_bytes) + " packed bytes do not hold " + std::to_string(n) + " codes");
  std::vector<uint8_t> c(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t b = packed[i / 2];
    c[static_cast<size_t>(i)] = (i % 2 == 0) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 15u);
  }
  return c;
}

}  // namespace qf
