// The host build of blas.h against plain loops that follow cuBLAS's and
// cuSOLVER's documented conventions: column-major, op(), leading dimensions
// larger than the rows (the padding must be neither read nor written), only
// the uplo triangle touched, and sizes that span several of the host
// build's 64-column chunks without being multiples of anything.
#include "device/blas.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.h"
#include "core/f16.h"

namespace qf::host {
namespace {

constexpr double kSentinel = -777.25;  // padding and untouched triangles keep it
const double kNan = std::numeric_limits<double>::quiet_NaN();

std::vector<double> random_matrix(int64_t ld, int64_t cols, uint32_t seed, int64_t rows) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> m(static_cast<size_t>(ld * cols), kSentinel);
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) m[static_cast<size_t>(r + c * ld)] = u(rng);
  return m;
}

// element (r, c) of op(X), X stored column-major with leading dimension ld
double at(const std::vector<double>& x, int64_t ld, Op op, int64_t r, int64_t c) {
  return op == Op::N ? x[static_cast<size_t>(r + c * ld)] : x[static_cast<size_t>(c + r * ld)];
}

void expect_padding_kept(const std::vector<double>& m, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = rows; r < ld; ++r) ASSERT_EQ(m[static_cast<size_t>(r + c * ld)], kSentinel) << r << "," << c;
}

TEST(DeviceBlasHost, GemmAllTransposesAndLeadingDimensions) {
  Blas blas;
  const int64_t m = 37, n = 131, k = 19;
  for (Op ta : {Op::N, Op::T})
    for (Op tb : {Op::N, Op::T}) {
      const int64_t ar = ta == Op::N ? m : k, ac = ta == Op::N ? k : m;
      const int64_t br = tb == Op::N ? k : n, bc = tb == Op::N ? n : k;
      const int64_t lda = ar + 3, ldb = br + 5, ldc = m + 2;
      const auto A = random_matrix(lda, ac, 1, ar), B = random_matrix(ldb, bc, 2, br);
      auto C = random_matrix(ldc, n, 3, m);
      const auto C0 = C;
      blas.gemm(ta, tb, m, n, k, -0.75, A.data(), lda, B.data(), ldb, 0.5, C.data(), ldc);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < m; ++i) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p) s += at(A, lda, ta, i, p) * at(B, ldb, tb, p, j);
          const double want = -0.75 * s + 0.5 * C0[static_cast<size_t>(i + j * ldc)];
          ASSERT_NEAR(C[static_cast<size_t>(i + j * ldc)], want, 1e-13 * (k + 1)) << i << "," << j;
        }
      expect_padding_kept(C, ldc, m, n);
    }
}

TEST(DeviceBlasHost, GemmBetaZeroDoesNotReadC) {
  Blas blas;
  const int64_t m = 5, n = 70, k = 3;
  const auto A = random_matrix(m, k, 4, m), B = random_matrix(k, n, 5, k);
  std::vector<double> C(static_cast<size_t>(m * n), kNan);
  blas.gemm(Op::N, Op::N, m, n, k, 1.0, A.data(), m, B.data(), k, 0.0, C.data(), m);
  for (double v : C) ASSERT_TRUE(std::isfinite(v));
}

TEST(DeviceBlasHost, GemmFloat) {
  Blas blas;
  const int64_t m = 9, n = 66, k = 7;
  std::vector<float> A(static_cast<size_t>(k * m)), B(static_cast<size_t>(k * n)), C(static_cast<size_t>(m * n), 1.0f);
  for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(i % 13) - 6.0f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(i % 7) - 3.0f;
  // C = A^T B + C with A stored k x m: small integers, exact in f32.
  blas.gemm(Op::T, Op::N, m, n, k, 1.0f, A.data(), k, B.data(), k, 1.0f, C.data(), m);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      float s = 1.0f;
      for (int64_t p = 0; p < k; ++p) s += A[static_cast<size_t>(p + i * k)] * B[static_cast<size_t>(p + j * k)];
      ASSERT_EQ(C[static_cast<size_t>(i + j * m)], s);
    }
}

// 16-bit operands: the f32 gemm of the widened values, for both formats,
// every transpose and leading dimensions with padding (whose bits, NaN
// here, must not be read).
TEST(DeviceBlasHost, Gemm16IsTheF32GemmOfTheWidenedValues) {
  Blas blas;
  const int64_t m = 70, n = 9, k = 67;
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (Half type : {Half::F16, Half::Bf16})
    for (Op ta : {Op::N, Op::T})
      for (Op tb : {Op::N, Op::T}) {
        const int64_t ar = ta == Op::N ? m : k, ac = ta == Op::N ? k : m, br = tb == Op::N ? k : n,
                      bc = tb == Op::N ? n : k, lda = ar + 3, ldb = br + 2;
        std::vector<uint16_t> A(static_cast<size_t>(lda * ac), 0x7e00), B(static_cast<size_t>(ldb * bc), 0x7e00);
        std::vector<float> Af(A.size(), 0.0f), Bf(B.size(), 0.0f);
        auto fill = [&](std::vector<uint16_t>& h, std::vector<float>& f, int64_t rows, int64_t cols, int64_t ld) {
          for (int64_t c = 0; c < cols; ++c)
            for (int64_t r = 0; r < rows; ++r) {
              const float v = g(rng);
              const uint16_t b = type == Half::F16 ? hd::f32_to_f16(v) : hd::f32_to_bf16(v);
              h[static_cast<size_t>(r + c * ld)] = b;
              f[static_cast<size_t>(r + c * ld)] = type == Half::F16 ? hd::f16_to_f32(b) : hd::bf16_to_f32(b);
            }
        };
        fill(A, Af, ar, ac, lda);
        fill(B, Bf, br, bc, ldb);
        std::vector<float> C(static_cast<size_t>(m * n), 0.5f), R = C;
        blas.gemm_16(type, ta, tb, m, n, k, 0.75f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), m);
        blas.gemm(ta, tb, m, n, k, 0.75f, Af.data(), lda, Bf.data(), ldb, 2.0f, R.data(), m);
        for (size_t i = 0; i < C.size(); ++i) ASSERT_EQ(C[i], R[i]) << i;
      }
}

// Attention's shape: scores of 3 query heads against one shared key head
// (stride 0), keys^T (T) times queries (N), heads d = 16 apart in a row of
// 3 * 16 + 5 padding.
TEST(DeviceBlasHost, StridedBatchedGemmSharesAMatrixAtStrideZero) {
  Blas blas;
  const int64_t d = 16, n = 37, heads = 3, ldq = heads * d + 5;
  std::vector<float> K(static_cast<size_t>(d * n)), Q(static_cast<size_t>(ldq * n), -5.0f);
  std::mt19937 rng(10);
  std::uniform_int_distribution<int> small(-4, 4);  // small integers: every sum exact in f32
  for (auto& v : K) v = static_cast<float>(small(rng));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < heads * d; ++j) Q[static_cast<size_t>(t * ldq + j)] = static_cast<float>(small(rng));
  std::vector<float> S(static_cast<size_t>(heads * n * n), 1.0f);
  blas.gemm_strided_batched(Op::T, Op::N, n, n, d, 0.5f, K.data(), d, 0, Q.data(), ldq, d, 2.0f, S.data(), n, n * n,
                            heads);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < n; ++i) {
        float want = 2.0f;
        for (int64_t j = 0; j < d; ++j)
          want += 0.5f * K[static_cast<size_t>(j + i * d)] * Q[static_cast<size_t>(t * ldq + h * d + j)];
        ASSERT_EQ(S[static_cast<size_t>(h * n * n + i + t * n)], want) << "head " << h << " key " << i << " query " << t;
      }
  // Products that would write over each other are refused, as cuBLAS leaves them undefined.
  EXPECT_THROW(blas.gemm_strided_batched(Op::T, Op::N, n, n, d, 1.0f, K.data(), d, 0, Q.data(), ldq, d, 0.0f,
                                         S.data(), n, n, heads),
               Error);
}

TEST(DeviceBlasHost, SyrkTouchesOnlyItsTriangle) {
  Blas blas;
  const int64_t n = 131, k = 11;
  for (Uplo uplo : {Uplo::Lower, Uplo::Upper})
    for (Op trans : {Op::N, Op::T}) {
      const int64_t ar = trans == Op::N ? n : k, ac = trans == Op::N ? k : n, lda = ar + 1, ldc = n + 4;
      const auto A = random_matrix(lda, ac, 6, ar);
      std::vector<double> C(static_cast<size_t>(ldc * n), kSentinel);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < n; ++i)
          if (uplo == Uplo::Lower ? i >= j : i <= j) C[static_cast<size_t>(i + j * ldc)] = 0.25 * static_cast<double>(i - j);
      const auto C0 = C;
      blas.syrk(uplo, trans, n, k, 2.0, A.data(), lda, -1.0, C.data(), ldc);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < n; ++i) {
          const double got = C[static_cast<size_t>(i + j * ldc)];
          if (uplo == Uplo::Lower ? i < j : i > j) {
            ASSERT_EQ(got, kSentinel) << "other triangle written at " << i << "," << j;
            continue;
          }
          double s = 0;  // op(A) op(A)^T: op(A) is n x k
          for (int64_t p = 0; p < k; ++p) s += at(A, lda, trans, i, p) * at(A, lda, trans, j, p);
          ASSERT_NEAR(got, 2.0 * s - C0[static_cast<size_t>(i + j * ldc)], 1e-13 * (k + 1)) << i << "," << j;
        }
      expect_padding_kept(C, ldc, n, n);
    }
}

// A symmetric positive definite n x n matrix with leading dimension ld,
// both triangles filled.
std::vector<double> spd(int64_t n, int64_t ld) {
  const auto X = random_matrix(n, n, 7, n);
  std::vector<double> a(static_cast<size_t>(ld * n), kSentinel);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < n; ++i) {
      double s = i == j ? static_cast<double>(n) : 0.0;
      for (int64_t p = 0; p < n; ++p) s += X[static_cast<size_t>(i + p * n)] * X[static_cast<size_t>(j + p * n)];
      a[static_cast<size_t>(i + j * ld)] = s;
    }
  return a;
}

TEST(DeviceBlasHost, PotrfFactorsItsTriangleOnly) {
  Blas blas;
  const int64_t n = 150, ld = n + 3;
  const auto A0 = spd(n, ld);
  for (Uplo uplo : {Uplo::Lower, Uplo::Upper}) {
    auto A = A0;
    // The other triangle holds garbage that must be neither read nor written.
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < n; ++i)
        if (uplo == Uplo::Lower ? i < j : i > j) A[static_cast<size_t>(i + j * ld)] = kNan;
    ASSERT_EQ(blas.potrf(uplo, n, A.data(), ld), 0);
    auto F = [&](int64_t i, int64_t j) {  // the factor: L (lower) or U (upper), zero elsewhere
      const bool in = uplo == Uplo::Lower ? i >= j : i <= j;
      return in ? A[static_cast<size_t>(i + j * ld)] : 0.0;
    };
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < n; ++i) {
        if (uplo == Uplo::Lower ? i < j : i > j) {
          ASSERT_TRUE(std::isnan(A[static_cast<size_t>(i + j * ld)]));
        }
        double s = 0;  // Lower: (L L^T)(i, j); Upper: (U^T U)(i, j)
        for (int64_t p = 0; p < n; ++p) s += uplo == Uplo::Lower ? F(i, p) * F(j, p) : F(p, i) * F(p, j);
        ASSERT_NEAR(s, A0[static_cast<size_t>(i + j * ld)], 1e-11 * n) << i << "," << j;
      }
    expect_padding_kept(A, ld, n, n);
  }
}

TEST(DeviceBlasHost, PotrfReportsTheFailingMinor) {
  Blas blas;
  const int64_t n = 90;
  std::vector<double> A(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) A[static_cast<size_t>(i + i * n)] = i == 70 ? -1.0 : 2.0;
  EXPECT_EQ(blas.potrf(Uplo::Lower, n, A.data(), n), 71);  // cuSOLVER: order of the first bad minor
}

TEST(DeviceBlasHost, TrsmEverySideTriangleTransposeAndDiagonal) {
  Blas blas;
  const int64_t m = 45, n = 133;
  for (Side side : {Side::Left, Side::Right})
    for (Uplo uplo : {Uplo::Lower, Uplo::Upper})
      for (Op ta : {Op::N, Op::T})
        for (Diag diag : {Diag::NonUnit, Diag::Unit}) {
          const int64_t na = side == Side::Left ? m : n, lda = na + 2, ldb = m + 1;
          auto A = random_matrix(lda, na, 8, na);
          for (int64_t i = 0; i < na; ++i) {  // well conditioned; the unused triangle is NaN
            A[static_cast<size_t>(i + i * lda)] = diag == Diag::Unit ? kNan : 4.0 + 0.01 * static_cast<double>(i);
            for (int64_t j = 0; j < na; ++j)
              if (uplo == Uplo::Lower ? i < j : i > j) A[static_cast<size_t>(i + j * lda)] = kNan;
              else if (i != j) A[static_cast<size_t>(i + j * lda)] *= 0.1;
          }
          const auto B0 = random_matrix(ldb, n, 9, m);
          auto X = B0;
          blas.trsm(side, uplo, ta, diag, m, n, 1.5, A.data(), lda, X.data(), ldb);
          auto opA = [&](int64_t i, int64_t j) {  // element of op(A) as the triangle and diag say
            const int64_t r = ta == Op::N ? i : j, c = ta == Op::N ? j : i;
            if (r == c) return diag == Diag::Unit ? 1.0 : A[static_cast<size_t>(r + c * lda)];
            if (uplo == Uplo::Lower ? r < c : r > c) return 0.0;
            return A[static_cast<size_t>(r + c * lda)];
          };
          for (int64_t j = 0; j < n; ++j)
            for (int64_t i = 0; i < m; ++i) {
              double s = 0;  // (op(A) X)(i, j) or (X op(A))(i, j)
              if (side == Side::Left)
                for (int64_t p = 0; p < m; ++p) s += opA(i, p) * X[static_cast<size_t>(p + j * ldb)];
              else
                for (int64_t p = 0; p < n; ++p) s += X[static_cast<size_t>(i + p * ldb)] * opA(p, j);
              ASSERT_NEAR(s, 1.5 * B0[static_cast<size_t>(i + j * ldb)], 1e-11)
                  << (side == Side::Left ? "left " : "right ") << (uplo == Uplo::Lower ? "lower " : "upper ")
                  << (ta == Op::N ? "N " : "T ") << (diag == Diag::Unit ? "unit" : "non-unit") << " at " << i << ","
                  << j;
            }
          expect_padding_kept(X, ldb, m, n);
        }
}

TEST(DeviceBlasHost, RejectsWhatCublasRejects) {
  Blas blas;
  std::vector<double> a(100, 1.0), b(100, 1.0), c(100, 0.0);
  try {
    blas.gemm(Op::N, Op::N, 10, 2, 3, 1.0, a.data(), 9, b.data(), 3, 0.0, c.data(), 10);  // lda < m
    FAIL() << "lda below m accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    EXPECT_NE(std::string(e.what()).find("gemm: lda = 9"), std::string::npos) << e.what();
  }
  EXPECT_THROW(blas.gemm(Op::T, Op::N, 10, 2, 3, 1.0, a.data(), 2, b.data(), 3, 0.0, c.data(), 10), Error);  // lda < k
  EXPECT_THROW(blas.gemm(Op::N, Op::T, 4, 5, 3, 1.0, a.data(), 4, b.data(), 4, 0.0, c.data(), 4), Error);   // ldb < n
  EXPECT_THROW(blas.syrk(Uplo::Lower, Op::T, 6, 4, 1.0, a.data(), 3, 0.0, c.data(), 6), Error);               // lda < k
  EXPECT_THROW(blas.potrf(Uplo::Upper, 5, a.data(), 4), Error);
  EXPECT_THROW(blas.trsm(Side::Right, Uplo::Lower, Op::N, Diag::Unit, 3, 6, 1.0, a.data(), 5, b.data(), 3), Error);
  EXPECT_THROW(blas.gemm(Op::N, Op::N, -1, 2, 3, 1.0, a.data(), 1, b.data(), 3, 0.0, c.data(), 1), Error);
}

}  // namespace
}  // namespace qf::host
