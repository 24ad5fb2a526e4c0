// The 8-group scale searches against 8 calls of the scalar searches, group
// by group and bit for bit, at every SIMD level (below AVX2 they are those
// calls). The groups mix the cases whose branches differ per lane: all zero,
// constant, all negative, tiny values, an outlier, ordinary data.
#include "quantizers/kquant_impl.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "simd_level_fixture.h"

namespace qf::kquants::detail {
namespace {

std::vector<float> groups(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(8 * n));
  for (int g = 0; g < 8; ++g) {
    const int kind = static_cast<int>((seed + static_cast<uint32_t>(g)) % 7);
    for (int i = 0; i < n; ++i) {
      float v = nd(rng) * 0.02f;
      if (kind == 0) v = 0.f;
      if (kind == 1) v = 0.0625f;
      if (kind == 2) v = -std::fabs(v);
      if (kind == 3) v *= 1e-12f;
      if (kind == 4 && i == 5) v = 0.5f;
      x[static_cast<size_t>(g * n + i)] = v;
    }
  }
  return x;
}

bool same(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

class SearchX8 : public test::SimdLevelFixture {};
INSTANTIATE_TEST_SUITE_P(KQuant, SearchX8, test::all_simd_levels(), test::simd_case_name);

TEST_P(SearchX8, AsymmetricMatchesScalar) {
  struct Case { int n, nmax; float rmin, rdelta; int nstep; bool mad, x3, weighted; };
  const Case cases[] = {{32, 15, -1.f, 0.1f, 20, false, false, true}, {32, 31, -0.5f, 0.1f, 15, false, false, true},
                        {16, 3, -0.5f, 0.1f, 15, true, false, true},  {32, 15, -0.9f, 0.05f, 36, false, true, true},
                        {16, 3, -0.9f, 0.05f, 36, false, true, false}, {32, 15, -1.f, 0.1f, 0, false, false, true}};
  for (const Case& c : cases) {
    for (uint32_t seed = 0; seed < 60; ++seed) {
      const auto x = groups(c.n, seed);
      std::vector<float> w(x.size());
      for (size_t i = 0; i < x.size(); ++i) w[i] = 0.01f + std::fabs(x[i]) * static_cast<float>(1 + i % 3);
      const float* wp = c.weighted ? w.data() : nullptr;
      uint8_t L[256], Lref[256], Laux[32];
      float s[8], m[8], sref[8], mref[8];
      search_asymmetric_x8(c.n, c.nmax, x.data(), wp, L, s, m, c.rmin, c.rdelta, c.nstep, c.mad, c.x3);
      for (int g = 0; g < 8; ++g)
        sref[g] = search_asymmetric(c.n, c.nmax, x.data() + g * c.n, wp ? wp + g * c.n : nullptr, Lref + g * c.n,
                                    &mref[g], Laux, c.rmin, c.rdelta, c.nstep, c.mad, c.x3);
      ASSERT_TRUE(same(s, sref, sizeof s)) << "n=" << c.n << " nmax=" << c.nmax << " seed=" << seed;
      ASSERT_TRUE(same(m, mref, sizeof m)) << "n=" << c.n << " nmax=" << c.nmax << " seed=" << seed;
      ASSERT_TRUE(same(L, Lref, static_cast<size_t>(8 * c.n))) << "n=" << c.n << " nmax=" << c.nmax << " seed=" << seed;
    }
  }
}

TEST_P(SearchX8, SymmetricMatchesScalar) {
  for (int nmax : {4, 32}) {
    for (bool weighted : {false, true}) {
      for (uint32_t seed = 0; seed < 60; ++seed) {
        const auto x = groups(16, seed);
        std::vector<float> w(x.size());
        for (size_t i = 0; i < x.size(); ++i) w[i] = (i % 9 == 0) ? 0.f : 0.3f + std::fabs(x[i]);
        const float* wp = weighted ? w.data() : nullptr;
        int8_t L[128], Lref[128];
        float s[8], sref[8];
        search_symmetric_x8(16, nmax, x.data(), L, s, wp);
        for (int g = 0; g < 8; ++g)
          sref[g] = search_symmetric(16, nmax, x.data() + 16 * g, Lref + 16 * g, wp ? wp + 16 * g : nullptr);
        ASSERT_TRUE(same(s, sref, sizeof s)) << "nmax=" << nmax << " seed=" << seed;
        ASSERT_TRUE(same(L, Lref, sizeof L)) << "nmax=" << nmax << " seed=" << seed;
      }
    }
  }
}

TEST_P(SearchX8, Q3MatchesScalar) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    const auto x = groups(16, seed);
    int8_t L[128], Lref[128];
    float s[8], sref[8];
    search_q3_x8(16, 4, x.data(), L, s);
    for (int g = 0; g < 8; ++g) sref[g] = search_q3(16, 4, x.data() + 16 * g, Lref + 16 * g);
    ASSERT_TRUE(same(s, sref, sizeof s)) << "seed=" << seed;
    ASSERT_TRUE(same(L, Lref, sizeof L)) << "seed=" << seed;
  }
}

}  // namespace
}  // namespace qf::kquants::detail
