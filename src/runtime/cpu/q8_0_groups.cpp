// Q8_0 groups of 16 interleaved rows (q8_0_groups.h): packing, unpacking, and
// the dot product as scalar reference and AVX-512 VNNI kernel.
//
// kquant_impl.h first: its pragma turns off FMA contraction in this file, as
// in dot_q8_0_ref's, and its reduce8 is the one that function reduces with,
// so the groups give that function's floats.
#include "quantizers/kquant_impl.h"
#include "runtime/cpu/q8_0_groups.h"

// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* operands).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>

#include "core/simd.h"
#include "quantizers/kquant_blocks.h"

namespace qf::rt {
namespace {

constexpr int kRows = kQ8_0GroupRows;
constexpr size_t kBlockBytes = sizeof(kquants::BlockQ8_0);
constexpr size_t kCodeBytes = 32 * kRows;      // one block of the 16 rows' codes
constexpr uint32_t kFlip = 0x80808080u;        // int8 code <-> code + 128, four at a time
constexpr size_t kPrefetchNear = 1024;         // bytes ahead in a group, into L1: two blocks
constexpr size_t kPrefetchFar = 4096;          // and into L2: eight blocks

using kquants::detail::h2f;
using kquants::detail::reduce8;

inline const uint8_t* scales_of(const uint8_t* group, int64_t blocks) {
  return group + static_cast<size_t>(blocks) * kCodeBytes;
}

#define QF_VNNI __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

// G groups (contiguous, `stride` bytes apart) against one token: block b's
// 16 terms of group g go to partial acc[g][b % 8], as the reference adds them.
// Two groups at a time are two streams of weights, each prefetched (measured
// on a 2-core Xeon, decode of a 1.1 B Q8_0 model: one group without software
// prefetch 21.0 tok/s, one group with the two prefetches 23.8, two groups with
// them 24.5; docs/runtime.md). The hardware prefetchers alone keep too few
// lines in flight per core to reach the memory's bandwidth.
template <int G>
QF_VNNI void groups_dot_vnni(const uint8_t* group, size_t stride, int64_t blocks, const Q8_0GroupActivation& a,
                             float* out) {
  __m512 acc[G][8];
  for (auto& per : acc)
    for (auto& v : per) v = _mm512_setzero_ps();
  const size_t scales_at = static_cast<size_t>(blocks) * kCodeBytes;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* q = a.row + static_cast<size_t>(b) * kBlockBytes + 2;
    __m512i av[8];
    for (int w = 0; w < 8; ++w) {
      int32_t four;
      std::memcpy(&four, q + 4 * w, 4);
      av[w] = _mm512_set1_epi32(four);
    }
    const __m512 da = _mm512_set1_ps(a.d[static_cast<size_t>(b)]);
    const __m512i offset = _mm512_set1_epi32(-a.offset[static_cast<size_t>(b)]);
    for (int g = 0; g < G; ++g) {
      const uint8_t* base = group + g * stride;
      const uint8_t* c = base + static_cast<size_t>(b) * kCodeBytes;
      for (int w = 0; w < 8; ++w) _mm_prefetch(reinterpret_cast<const char*>(c + kPrefetchNear + 64 * w), _MM_HINT_T0);
      for (int w = 0; w < 8; ++w) _mm_prefetch(reinterpret_cast<const char*>(c + kPrefetchFar + 64 * w), _MM_HINT_T1);
      __m512i s = offset;
      for (int w = 0; w < 8; ++w) s = _mm512_dpbusd_epi32(s, _mm512_loadu_si512(c + 64 * w), av[w]);
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + scales_at + 32 * b)));
      acc[g][b % 8] = _mm512_add_ps(acc[g][b % 8], _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(s)));
    }
  }
  for (int g = 0; g < G; ++g) {
    const __m512* p = acc[g];
    const __m512 r = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(p[0], p[4]), _mm512_add_ps(p[2], p[6])),
                                   _mm512_add_ps(_mm512_add_ps(p[1], p[5]), _mm512_add_ps(p[3], p[7])));
    _mm512_storeu_ps(out + kRows * g, r);
  }
}

bool cpu_has_vnni() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return yes;
}

inline uint32_t load4(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void store4(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

}  // namespace

void q8_0_group_pack(uint8_t* rows, int64_t blocks, std::vector<uint8_t>& scratch) {
  const size_t row_bytes = static_cast<size_t>(blocks) * kBlockBytes;
  scratch.assign(rows, rows + kRows * row_bytes);
  uint8_t* scales = rows + static_cast<size_t>(blocks) * kCodeBytes;
  for (int r = 0; r < kRows; ++r) {
    const uint8_t* row = scratch.data() + r * row_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = row + static_cast<size_t>(b) * kBlockBytes;
      std::memcpy(scales + (static_cast<size_t>(b) * kRows + r) * 2, blk, 2);
      uint8_t* c = rows + static_cast<size_t>(b) * kCodeBytes + 4 * r;
      for (int g = 0; g < 8; ++g) store4(c + 64 * g, load4(blk + 2 + 4 * g) ^ kFlip);
    }
  }
}

void q8_0_group_unpack_row(const uint8_t* group, int64_t blocks, int r, uint8_t* row) {
  const uint8_t* scales = scales_of(group, blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* blk = row + static_cast<size_t>(b) * kBlockBytes;
    std::memcpy(blk, scales + (static_cast<size_t>(b) * kRows + r) * 2, 2);
    const uint8_t* c = group + static_cast<size_t>(b) * kCodeBytes + 4 * r;
    for (int g = 0; g < 8; ++g) store4(blk + 2 + 4 * g, load4(c + 64 * g) ^ kFlip);
  }
}

void q8_0_group_activation(const uint8_t* row, int64_t blocks, Q8_0GroupActivation& out) {
  out.row = row;
  out.d.resize(static_cast<size_t>(blocks));
  out.offset.resize(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + static_cast<size_t>(b) * kBlockBytes;
    uint16_t h;
    std::memcpy(&h, blk, 2);
    out.d[static_cast<size_t>(b)] = h2f(h);
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += static_cast<int8_t>(blk[2 + i]);
    out.offset[static_cast<size_t>(b)] = 128 * s;
  }
}

void q8_0_group_dot_ref(const uint8_t* group, int64_t blocks, const Q8_0GroupActivation& a, float* out) {
  const uint8_t* scales = scales_of(group, blocks);
  for (int r = 0; r < kRows; ++r) {
    float acc[8] = {};
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* c = group + static_cast<size_t>(b) * kCodeBytes + 4 * r;
      const uint8_t* q = a.row + static_cast<size_t>(b) * kBlockBytes + 2;
      int32_t isum = 0;
      for (int i = 0; i < 32; ++i)
        isum += (static_cast<int32_t>(c[64 * (i / 4) + i % 4]) - 128) * static_cast<int8_t>(q[i]);
      uint16_t h;
      std::memcpy(&h, scales + (static_cast<size_t>(b) * kRows + r) * 2, 2);
      acc[b % 8] += (h2f(h) * a.d[static_cast<size_t>(b)]) * static_cast<float>(isum);
    }
    out[r] = reduce8(acc);
  }
}

bool q8_0_groups_fast() { return simd_level() >= SimdLevel::Avx512 && cpu_has_vnni(); }

void q8_0_groups_dot(const uint8_t* groups, int64_t count, int64_t blocks, const Q8_0GroupActivation& a, float* out) {
  const size_t stride = static_cast<size_t>(blocks) * kBlockBytes * kRows;
  if (!q8_0_groups_fast()) {
    for (int64_t g = 0; g < count; ++g) q8_0_group_dot_ref(groups + g * stride, blocks, a, out + kRows * g);
    return;
  }
  int64_t g = 0;
  for (; g + 2 <= count; g += 2) groups_dot_vnni<2>(groups + g * stride, stride, blocks, a, out + kRows * g);
  if (g < count) groups_dot_vnni<1>(groups + g * stride, stride, blocks, a, out + kRows * g);
}

}  // namespace qf::rt
