// Activations prepared for the AMX GEMM (amx_gemm.h): each f32 split into
// two bf16 pieces (hi, and the rest rounded), stored pair-interleaved per
// block of 16 tokens as the tiles read them, and each sub-block's f32 sum.

// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* operands).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "runtime/cpu/amx_gemm.h"

namespace qf::rt {

namespace {

#define QF_AMX_SPLIT __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512bf16")))

// A 16 x 16 matrix of 32-bit elements (r[i] holds row i) transposed in
// registers: r[u] becomes column u.
QF_AMX_SPLIT inline void transpose16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) {
      t[8 * h + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + 4 + i], 0x88);
      t[8 * h + 4 + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + 4 + i], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);
  }
}

// The 16 bf16 in h as f32.
QF_AMX_SPLIT inline __m512 bf16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 32 floats of one token -> hi = bf16(a) and mid = bf16(a - hi) (a - hi is
// exact in f32), 32 bf16 each: element pairs in 32-bit lanes.
QF_AMX_SPLIT inline void split32(const float* x, __m512i* hi, __m512i* mid) {
  const __m512 a0 = _mm512_loadu_ps(x), a1 = _mm512_loadu_ps(x + 16);
  const __m512i h = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(a1, a0));
  const __m512 r0 = _mm512_sub_ps(a0, bf16_to_f32(_mm512_castsi512_si256(h)));
  const __m512 r1 = _mm512_sub_ps(a1, bf16_to_f32(_mm512_extracti64x4_epi64(h, 1)));
  *hi = h;
  *mid = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(r1, r0));
}

// One block of 16 tokens (`valid` of them real, the rest zeros): the pieces
// 32 elements at a time, each piece's 16 tokens x 16 pairs transposed to
// 16 pairs x 16 tokens, which is the tiles' layout; dst holds the block's
// pieces as 32-bit units [2][k / 2][16].
QF_AMX_SPLIT void split_block(const float* x, int64_t x_stride, int64_t valid, int64_t k, uint32_t* dst) {
  const int64_t half = k / 2;
  for (int64_t i = 0; i < k; i += 32) {
    __m512i hi[16], mid[16];
    for (int64_t t = 0; t < 16; ++t) {
      if (t < valid) {
        split32(x + t * x_stride + i, &hi[t], &mid[t]);
      } else {
        hi[t] = mid[t] = _mm512_setzero_si512();
      }
    }
    transpose16(hi);
    transpose16(mid);
    for (int u = 0; u < 16; ++u) {
      _mm512_storeu_si512(dst + (i / 2 + u) * 16, hi[u]);
      _mm512_storeu_si512(dst + (half + i / 2 + u) * 16, mid[u]);
    }
  }
}

// Sum of `sub` floats (16 or 32) in a fixed order: lane-wise adds of the
// 16-float chunks, then the tree of _mm512_reduce_add_ps.
QF_AMX_SPLIT inline float sub_block_sum(const float* x, int64_t sub) {
  __m512 s = _mm512_loadu_ps(x);
  for (int64_t i = 16; i < sub; i += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + i));
  return _mm512_reduce_add_ps(s);
}

}  // namespace

void amx_activations_reserve(AmxActivations& out, int64_t tokens, int64_t k, int sub, bool sums) {
  if (tokens < 1 || k < 32 || k % 32 != 0 || (sub != 16 && sub != 32))
    throw Error(ErrorKind::Internal, "amx_activations_reserve: bad shape");
  out.tokens = tokens, out.k = k, out.sub = sub, out.blocks = (tokens + 15) / 16;
  out.pieces.resize(static_cast<size_t>(out.blocks * 2 * k * 16));
  // amx_prepare_activations writes every sum, padding tokens' included.
  out.sums.resize(sums ? static_cast<size_t>(out.blocks * (k / sub) * 16) : 0);
}

QF_AMX_SPLIT void amx_prepare_activations(const float* x, int64_t x_stride, AmxActivations& out, int64_t b0, int64_t b1) {
  const int64_t k = out.k, subs = k / out.sub;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t valid = std::min<int64_t>(16, out.tokens - b * 16);
    split_block(x + b * 16 * x_stride, x_stride, valid, k, reinterpret_cast<uint32_t*>(out.pieces.data() + b * 2 * k * 16));
    if (out.sums.empty()) continue;
    float* sums = out.sums.data() + b * subs * 16;
    for (int64_t t = 0; t < 16; ++t)
      for (int64_t j = 0; j < subs; ++j)
        sums[j * 16 + t] = t < valid ? sub_block_sum(x + (b * 16 + t) * x_stride + j * out.sub, out.sub) : 0.0f;
  }
}

}  // namespace qf::rt
