// The cpu backend's bf16 products (src/compute/cpu/bf16_gemm.cpp): operands rounded to bf16 as
// round_to rounds them, fp32 accumulation and output, through oneDNN where it has bf16 kernels
// for the CPU; DISTMUON_CPU_BF16=emulate (this test's second ctest entry) chooses the emulation.
//
// The reference is the product of the rounded operands in double. What separates the two is fp32
// accumulation only (the operands are the same bf16 values, and a product of two bf16 values is
// exact in fp32): at most k u sum_l |a_il b_lj| for k terms, u = 2^-24, whatever the order
// (Higham, Accuracy and Stability, 3.1), plus one rounding each of alpha's scaling and beta's
// term. The test allows twice that. bf16's own rounding (u = 2^-9 per operand) is thousands of
// times larger, so a product of unrounded operands, or with an operand left unrounded, fails it.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "compute/cpu/bf16_gemm.h"
#include "distmuon/compute.h"
#include "distmuon/precision.h"
#include "test_util.h"

namespace distmuon {
namespace {

bool emulated_by_request() {
  const char* env = std::getenv("DISTMUON_CPU_BF16");
  return env != nullptr && std::string(env) == "emulate";
}

// op(x)(i, l) of a stored matrix.
float at(ConstMatrixView x, Trans t, Index i, Index l) {
  return t == Trans::kNo ? x(i, l) : x(l, i);
}

// Every element of c_got within the fp32-accumulation bound of alpha op(a) op(b) + beta c0 on
// operands rounded to bf16, computed in double.
void expect_rounded_product(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b,
                            float beta, ConstMatrixView c0, ConstMatrixView c_got,
                            const std::string& what) {
  const Index k = ta == Trans::kNo ? a.cols : a.rows;
  const double u = std::ldexp(1.0, -24);
  for (Index i = 0; i < c_got.rows; ++i) {
    for (Index j = 0; j < c_got.cols; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (Index l = 0; l < k; ++l) {
        const double p = static_cast<double>(round_to(Precision::kBf16, at(a, ta, i, l))) *
                         round_to(Precision::kBf16, at(b, tb, l, j));
        sum += p;
        magnitude += std::abs(p);
      }
      const double prior = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c0(i, j);
      const double want = alpha * sum + prior;
      const double bound =
          2.0 * ((k + 2) * u * std::abs(alpha) * magnitude + 2 * u * std::abs(prior)) + 1e-30;
      ASSERT_LE(std::abs(c_got(i, j) - want), bound)
          << what << " at (" << i << ", " << j << "): got " << c_got(i, j) << ", want " << want;
    }
  }
}

// Products of the shapes NS runs (a Gram matrix of either side, the square of a symmetric
// matrix, the update on either side) at odd sizes, each transposition, alpha and beta, a c whose
// rows are longer than it (ld > cols), and beta = 0 over a c holding NaN (overwritten).
TEST(CpuBf16Gemm, EveryTranspositionAndOddShapeWithinFp32AccumulationOfRoundedOperands) {
  struct Case {
    Index m, n, k;
  };
  const Case cases[] = {{13, 11, 37}, {1, 7, 5}, {67, 129, 33}, {5, 8, 1}, {96, 40, 40}};
  std::uint64_t seed = 10;
  for (const Case& s : cases) {
    for (const Trans ta : {Trans::kNo, Trans::kYes}) {
      for (const Trans tb : {Trans::kNo, Trans::kYes}) {
        const Matrix a = ta == Trans::kNo ? test::random_matrix(s.m, s.k, ++seed)
                                          : test::random_matrix(s.k, s.m, ++seed);
        const Matrix b = tb == Trans::kNo ? test::random_matrix(s.k, s.n, ++seed)
                                          : test::random_matrix(s.n, s.k, ++seed);
        for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-2.0315f, 0.75f}}) {
          Matrix wide = test::random_matrix(s.m, s.n + 3, ++seed);  // c: ld = n + 3
          if (beta == 0.0f) wide(0, 0) = std::numeric_limits<float>::quiet_NaN();
          const Matrix before = wide;
          const MatrixView c = wide.view().block(0, 0, s.m, s.n);
          Matrix c0(s.m, s.n);
          copy(c, c0.view());
          cpu_compute().gemm(ta, tb, alpha, a.view(), b.view(), beta, c, Precision::kBf16);
          const std::string what =
              fmt::format("{}x{}x{} ta {} tb {} alpha {} beta {}", s.m, s.n, s.k, ta == Trans::kYes,
                          tb == Trans::kYes, alpha, beta);
          expect_rounded_product(ta, tb, alpha, a.view(), b.view(), beta, c0.view(), c, what);
          for (Index i = 0; i < s.m; ++i) {  // the columns past n are untouched
            for (Index j = s.n; j < s.n + 3; ++j)
              ASSERT_EQ(wide(i, j), before(i, j)) << what;
          }
        }
      }
    }
  }
}

// syrk (either side: X X^T of a wide X, X^T X of a tall one) and the gemm of a with itself: one
// bf16 copy serves both operands, c is exactly symmetric, within the bound above. At one thread
// orders 515 and 1030 are computed in 2 and 4 row panels of unequal heights (bf16_gemm.h); at two
// threads (the BLAS thread count, which oneDNN follows) as one product.
TEST(CpuBf16Gemm, SyrkIsSymmetricWithinFp32AccumulationOfRoundedOperands) {
  struct Case {
    Index n, k;
    int threads;
  };
  const int threads_before = blas_threads();
  std::uint64_t seed = 30;
  for (const Case s : {Case{41, 77, 1}, Case{515, 9, 1}, Case{1030, 5, 1}, Case{515, 9, 2}}) {
    set_blas_threads(s.threads);
    for (const Trans t : {Trans::kNo, Trans::kYes}) {
      const Matrix a = t == Trans::kNo ? test::random_matrix(s.n, s.k, ++seed)
                                       : test::random_matrix(s.k, s.n, ++seed);
      const Trans other = t == Trans::kNo ? Trans::kYes : Trans::kNo;
      Matrix c0 = test::random_matrix(s.n, s.n, ++seed);
      for (Index i = 0; i < s.n; ++i) {  // a symmetric prior c for beta != 0
        for (Index j = 0; j < i; ++j)
          c0(i, j) = c0(j, i);
      }
      for (const float beta : {2.0f, 0.0f}) {
        Matrix c = c0;
        if (beta == 0.0f) c(s.n - 1, s.n - 1) = std::numeric_limits<float>::quiet_NaN();
        cpu_compute().syrk(t, 0.5f, a.view(), beta, c.view(), Precision::kBf16);
        const std::string what = fmt::format("syrk {}x{} t {} beta {} threads {}", s.n, s.k,
                                             t == Trans::kYes, beta, s.threads);
        expect_rounded_product(t, other, 0.5f, a.view(), a.view(), beta, c0.view(), c.view(), what);
        for (Index i = 0; i < s.n; ++i) {
          for (Index j = 0; j < i; ++j)
            ASSERT_EQ(c(i, j), c(j, i)) << what << " at " << i << "," << j;
        }
      }
      if (s.n > 100) continue;
      Matrix g(s.n, s.n);
      cpu_compute().gemm(t, other, 1.0f, a.view(), a.view(), 0.0f, g.view(), Precision::kBf16);
      expect_rounded_product(t, other, 1.0f, a.view(), a.view(), 0.0f, g.view(), g.view(), "a a^T");
    }
  }
  set_blas_threads(threads_before);
}

// The conversion is round_to's, bit for bit: ties to even, a value past the largest bf16 to Inf,
// Inf kept, NaN kept NaN (also one whose payload lies only in the dropped bits), on a strided view.
TEST(CpuBf16Gemm, ConversionIsRoundTo) {
  Matrix m = test::random_matrix(3, 70, 6);
  const float one = 1.0f;
  m(0, 0) = one + std::ldexp(1.0f, -8);      // a tie: to even (1)
  m(0, 1) = one + 3 * std::ldexp(1.0f, -8);  // a tie: up
  m(0, 2) = -(one + 3 * std::ldexp(1.0f, -8));
  m(0, 3) = std::numeric_limits<float>::max();
  m(0, 4) = -std::numeric_limits<float>::infinity();
  m(0, 5) = std::numeric_limits<float>::denorm_min();
  m(0, 6) = std::bit_cast<float>(0x7f800001u);  // a NaN with its payload in the dropped bits
  m(0, 7) = std::numeric_limits<float>::quiet_NaN();
  const ConstMatrixView v = m.view().block(0, 1, 3, 66);  // ld 70 > cols 66
  for (const int threads : {1, 2}) {
    std::vector<std::uint16_t> out(static_cast<std::size_t>(v.rows * v.cols));
    detail::to_bf16(v, out.data(), threads);
    for (Index i = 0; i < v.rows; ++i) {
      for (Index j = 0; j < v.cols; ++j) {
        const std::uint16_t got = out[static_cast<std::size_t>(i * v.cols + j)];
        const float as_float = std::bit_cast<float>(static_cast<std::uint32_t>(got) << 16);
        if (std::isnan(v(i, j))) {
          EXPECT_TRUE(std::isnan(as_float)) << i << "," << j;
        } else {
          EXPECT_EQ(std::bit_cast<std::uint32_t>(as_float),
                    std::bit_cast<std::uint32_t>(round_to(Precision::kBf16, v(i, j))))
              << i << "," << j << " threads " << threads;
        }
      }
    }
  }
}

// Which path runs: oneDNN on a CPU where it has bf16 kernels (named in the summary), the
// emulation on request, and the emulation is sgemm on rounded copies bit for bit.
TEST(CpuBf16Gemm, PathFollowsTheRequest) {
  const std::string summary = detail::bf16_gemm_summary();
  if (emulated_by_request()) {
    EXPECT_FALSE(detail::onednn_bf16_enabled());
    EXPECT_NE(summary.find("DISTMUON_CPU_BF16=emulate"), std::string::npos) << summary;
    const Matrix a = test::random_matrix(13, 37, 7), b = test::random_matrix(37, 11, 8);
    Matrix ra = a, rb = b;
    for (float& v : ra.values())
      v = round_to(Precision::kBf16, v);
    for (float& v : rb.values())
      v = round_to(Precision::kBf16, v);
    Matrix want(13, 11), got(13, 11);
    cpu_compute().gemm(Trans::kNo, Trans::kNo, 1.0f, ra.view(), rb.view(), 0.0f, want.view());
    cpu_compute().gemm(Trans::kNo, Trans::kNo, 1.0f, a.view(), b.view(), 0.0f, got.view(),
                       Precision::kBf16);
    EXPECT_EQ(got.values().size(), want.values().size());
    for (std::size_t i = 0; i < got.values().size(); ++i)
      ASSERT_EQ(got.values()[i], want.values()[i]) << i;
  } else if (detail::onednn_bf16_enabled()) {
    EXPECT_EQ(summary.rfind("oneDNN ", 0), 0u) << summary;
  } else {
    EXPECT_EQ(summary.rfind("emulated (", 0), 0u) << summary;
  }
}

}  // namespace
}  // namespace distmuon
