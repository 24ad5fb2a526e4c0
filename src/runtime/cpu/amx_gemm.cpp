// The AMX tile GEMM of amx_gemm.h: for each block of 16 tokens and each
// sub-block, up to four 16 x 16 f32 tiles (16 weight rows x 16 tokens each)
// take the two activation pieces' bf16 dot products with the weight codes;
// the tiles are then stored and scaled into an f32 accumulator in L1.

// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* operands).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/simd.h"
#include "runtime/cpu/amx_gemm.h"

#define QF_AMX __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

namespace qf::rt {

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0..3: the accumulators (16 weight rows x 16 tokens of f32); 4 and 5:
// 16 weight rows x `sub` codes (alternate groups of rows, so one group's codes
// load while the other's multiply); 6 and 7: the two activation pieces,
// sub / 2 pairs x 16 tokens.
QF_AMX void configure(int sub) {
  TileConfig c;
  for (int i = 0; i < 4; ++i) c.rows[i] = 16, c.colsb[i] = 64;
  c.rows[4] = 16, c.colsb[4] = static_cast<uint16_t>(2 * sub);
  c.rows[5] = 16, c.colsb[5] = static_cast<uint16_t>(2 * sub);
  for (int i = 6; i < 8; ++i) c.rows[i] = static_cast<uint8_t>(sub / 2), c.colsb[i] = 64;
  _tile_loadconfig(&c);
}

// Adds sub-blocks j .. j + count - 1 (count 1 or 2; their stored tiles in
// c[0], c[1]) into the accumulator, in order: for each, acc[r] = fma(scale[r],
// c[r], acc[r]), then (with mins) fma(-min[r], sums of the tokens' sub-block,
// acc[r]). Two at a time load and store the accumulator half as often; the
// floats are the same.
template <int G, int kCount>
QF_AMX inline void scale_into(const AmxWeightTile& tile, const float* sums, int64_t j,
                              const float (*const* c)[16][16], float (*acc)[16]) {
  const float* scale[kCount];
  const float* min[kCount];
  __m512 s[kCount];
  for (int i = 0; i < kCount; ++i) {
    scale[i] = tile.scale.data() + (j + i) * 64;
    min[i] = tile.has_min ? tile.min.data() + (j + i) * 64 : nullptr;
    s[i] = tile.has_min ? _mm512_loadu_ps(sums + (j + i) * 16) : _mm512_setzero_ps();
  }
  if (tile.has_min) {
    for (int r = 0; r < G * 16; ++r) {
      __m512 a = _mm512_load_ps(acc[r]);
      for (int i = 0; i < kCount; ++i) {
        a = _mm512_fmadd_ps(_mm512_set1_ps(scale[i][r]), _mm512_load_ps(c[i][r / 16][r % 16]), a);
        a = _mm512_fnmadd_ps(_mm512_set1_ps(min[i][r]), s[i], a);
      }
      _mm512_store_ps(acc[r], a);
    }
  } else {
    for (int r = 0; r < G * 16; ++r) {
      __m512 a = _mm512_load_ps(acc[r]);
      for (int i = 0; i < kCount; ++i)
        a = _mm512_fmadd_ps(_mm512_set1_ps(scale[i][r]), _mm512_load_ps(c[i][r / 16][r % 16]), a);
      _mm512_store_ps(acc[r], a);
    }
  }
}

// Sub-block j's tiles go to c[j % 4]; the scaling of earlier sub-blocks,
// two at a time, follows them in program order, so the vector units scale
// while the tiles multiply the next sub-block.
template <int G>
QF_AMX void tile_gemm(const AmxActivations& act, const AmxWeightTile& tile, float* y, int64_t y_stride) {
  const int64_t k = act.k, sub = act.sub, subs = k / sub, code_stride = 2 * sub;
  alignas(64) float c[4][G][16][16];
  alignas(64) float acc[G * 16][16];
  auto post = [&](const float* sums, int64_t j, int count) {
    const float (*cs[2])[16][16] = {c[j % 4], c[(j + 1) % 4]};
    if (count == 2) scale_into<G, 2>(tile, sums, j, cs, acc);
    else scale_into<G, 1>(tile, sums, j, cs, acc);
  };
  for (int64_t b = 0; b < act.blocks; ++b) {
    std::memset(acc, 0, sizeof acc);
    const uint16_t* pieces = act.pieces.data() + b * 2 * k * 16;
    const float* sums = tile.has_min ? act.sums.data() + b * subs * 16 : nullptr;
    int64_t next = 0;  // the first sub-block not yet scaled into acc
    for (int64_t j = 0; j < subs; ++j) {
      _tile_zero(0);
      if constexpr (G > 1) _tile_zero(1);
      if constexpr (G > 2) _tile_zero(2);
      if constexpr (G > 3) _tile_zero(3);
      const int64_t pair0 = j * sub / 2;
      _tile_loadd(6, pieces + pair0 * 32, 64);
      _tile_loadd(7, pieces + (k / 2 + pair0) * 32, 64);
      const uint16_t* codes = tile.codes.data() + j * 16 * sub;
      float (*cj)[16][16] = c[j % 4];
#define QF_AMX_GROUP(g, a)                           \
  _tile_loadd(a, codes + (g) * 16 * k, code_stride); \
  _tile_dpbf16ps(g, a, 6);                           \
  _tile_dpbf16ps(g, a, 7);                           \
  _tile_stored(g, cj[g], 64);
      QF_AMX_GROUP(0, 4)
      if constexpr (G > 1) { QF_AMX_GROUP(1, 5) }
      if constexpr (G > 2) { QF_AMX_GROUP(2, 4) }
      if constexpr (G > 3) { QF_AMX_GROUP(3, 5) }
#undef QF_AMX_GROUP
      // Sub-blocks stored in earlier iterations, in pairs (at most j - 1 and
      // j - 2 wait here, so the ring of four never overwrites one).
      if (next + 1 <= j - 1) {
        post(sums, next, 2);
        next += 2;
      }
    }
    for (; next < subs; next += 2) post(sums, next, static_cast<int>(std::min<int64_t>(2, subs - next)));
    const int64_t tokens = std::min<int64_t>(16, act.tokens - b * 16);
    for (int64_t t = 0; t < tokens; ++t) {
      float* yt = y + (b * 16 + t) * y_stride;
      for (int64_t r = 0; r < tile.rows; ++r) yt[r] = acc[r][t];
    }
  }
}

}  // namespace

QF_AMX void amx_gemm_tile(const AmxActivations& act, const AmxWeightTile& tile, float* y, int64_t y_stride) {
  if (simd_level() < SimdLevel::Amx || tile.rows < 1 || tile.rows > 64 || (tile.has_min && act.sums.empty()) ||
      tile.codes.size() < static_cast<size_t>((tile.rows + 15) / 16 * 16 * act.k))
    throw Error(ErrorKind::Internal, "amx_gemm_tile: needs the AMX level and a decoded tile of the activations' k");
  configure(static_cast<int>(act.sub));
  switch ((tile.rows + 15) / 16) {
    case 1: tile_gemm<1>(act, tile, y, y_stride); break;
    case 2: tile_gemm<2>(act, tile, y, y_stride); break;
    case 3: tile_gemm<3>(act, tile, y, y_stride); break;
    default: tile_gemm<4>(act, tile, y, y_stride); break;
  }
  _tile_release();
}

}  // namespace qf::rt
