// The CPU backend's elementwise operations (fill, copy, the finite check, Muon's momentum step,
// AdamW's step) against independent references, on strided views so that the leading dimension
// is honoured and the elements outside a view are left alone.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

// A 4 x 6 buffer whose left 4 x 4 block is the view under test (ld 6): the two right columns
// must keep their sentinel value.
constexpr float kSentinel = -7.0f;
struct Strided {
  Matrix buf{4, 6};
  Strided() {
    for (float& v : buf.values())
      v = kSentinel;
  }
  MatrixView view() { return buf.view().block(0, 0, 4, 4); }
  bool outside_untouched() const {
    for (Index i = 0; i < 4; ++i)
      for (Index j = 4; j < 6; ++j)
        if (buf(i, j) != kSentinel) return false;
    return true;
  }
};

// Small dyadic values: every product and sum below is exact in float.
float dyadic(Index i, Index j, int seed) {
  return static_cast<float>((i * 5 + j * 3 + seed) % 7 - 3) * 0.25f;
}

TEST(CpuComputeElementwise, FillAndCopyHonourTheLeadingDimension) {
  Strided a;
  cpu_compute().fill(a.view(), 1.5f);
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 4; ++j)
      EXPECT_EQ(a.buf(i, j), 1.5f);
  EXPECT_TRUE(a.outside_untouched());

  Matrix src(4, 4);
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 4; ++j)
      src(i, j) = dyadic(i, j, 1);
  Strided b;
  cpu_compute().copy(src.view(), b.view());
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 4; ++j)
      EXPECT_EQ(b.buf(i, j), src(i, j));
  EXPECT_TRUE(b.outside_untouched());
  // Strided to contiguous.
  Matrix back(4, 4);
  cpu_compute().copy(b.view(), back.view());
  EXPECT_EQ(back.values().size(), src.values().size());
  for (Index k = 0; k < 16; ++k)
    EXPECT_EQ(back.data()[k], src.data()[k]);
  Matrix wrong(3, 4);
  EXPECT_THROW(cpu_compute().copy(src.view(), wrong.view()), Error);
}

TEST(CpuComputeElementwise, FindNonFiniteReportsTheFirstInRowMajorOrder) {
  Strided a;
  cpu_compute().fill(a.view(), 0.5f);
  // Non-finite values outside the view are not looked at.
  a.buf(0, 5) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(cpu_compute().find_non_finite(a.view()).has_value());
  a.buf(3, 0) = std::numeric_limits<float>::infinity();
  a.buf(2, 3) = -std::numeric_limits<float>::infinity();
  const auto bad = cpu_compute().find_non_finite(a.view());
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->row, 2);
  EXPECT_EQ(bad->col, 3);
  a.buf(1, 1) = std::numeric_limits<float>::quiet_NaN();
  const auto nan = cpu_compute().find_non_finite(a.view());
  ASSERT_TRUE(nan.has_value());
  EXPECT_EQ(nan->row, 1);
  EXPECT_EQ(nan->col, 1);
  // A view that stops before the bad rows is finite.
  EXPECT_FALSE(cpu_compute().find_non_finite(a.view().row_block(0, 1)).has_value());
}

// mu = 0.5 and l2 = 0.25 on dyadic inputs keep every intermediate exact, so the double
// reference equals the float result exactly.
TEST(CpuComputeElementwise, MuonMomentumMatchesTheFormula) {
  for (const bool nesterov : {true, false}) {
    for (const float l2 : {0.0f, 0.25f}) {
      Matrix g(4, 4), w(4, 4), buf(4, 4);
      for (Index i = 0; i < 4; ++i)
        for (Index j = 0; j < 4; ++j) {
          g(i, j) = dyadic(i, j, 1);
          w(i, j) = dyadic(i, j, 2);
          buf(i, j) = dyadic(i, j, 3);
        }
      const Matrix buf0 = buf;
      Strided u;
      cpu_compute().muon_momentum({0.5f, l2, nesterov}, g.view(), w.view(), buf.view(), u.view());
      for (Index i = 0; i < 4; ++i)
        for (Index j = 0; j < 4; ++j) {
          const double gl = double{g(i, j)} + double{l2} * w(i, j);
          const double b = 0.5 * buf0(i, j) + 0.5 * gl;
          EXPECT_EQ(buf(i, j), b);
          EXPECT_EQ(u.buf(i, j), nesterov ? 0.5 * gl + 0.5 * b : b) << i << "," << j;
        }
      EXPECT_TRUE(u.outside_untouched());
    }
  }
  Matrix g(4, 4), w(4, 3), buf(4, 4), u(4, 4);
  EXPECT_THROW(cpu_compute().muon_momentum({}, g.view(), w.view(), buf.view(), u.view()), Error);
}

// AdamW's first step from zero moments: m / bias1 = g and sqrt(v) / bias2_sqrt = |g|, so
// p = p decay - lr g / (|g| + eps). Float rounding of the bias corrections: relative 1e-6.
TEST(CpuComputeElementwise, AdamWFirstStepIsSignDescent) {
  const double b1 = 0.9, b2 = 0.95, lr = 0.01, wd = 0.1, eps = 1e-8;
  AdamWStep k;
  k.beta1 = static_cast<float>(b1);
  k.beta2 = static_cast<float>(b2);
  k.bias1 = static_cast<float>(1 - b1);
  k.bias2_sqrt = static_cast<float>(std::sqrt(1 - b2));
  k.decay = static_cast<float>(1 - lr * wd);
  k.lr = static_cast<float>(lr);
  k.eps = static_cast<float>(eps);
  Matrix g(4, 4), m(4, 4), v(4, 4);
  Strided p;
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 4; ++j) {
      g(i, j) = dyadic(i, j, 1) + 0.125f;  // never zero
      p.buf(i, j) = dyadic(i, j, 2);
    }
  const Matrix p0 = p.buf;
  cpu_compute().adamw(k, g.view(), m.view(), v.view(), p.view());
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 4; ++j) {
      const double gij = g(i, j);
      EXPECT_NEAR(m(i, j), (1 - b1) * gij, 1e-6 * std::abs(gij));
      EXPECT_NEAR(v(i, j), (1 - b2) * gij * gij, 1e-6 * gij * gij);
      const double ref = p0(i, j) * (1 - lr * wd) - lr * gij / (std::abs(gij) + eps);
      EXPECT_NEAR(p.buf(i, j), ref, 1e-6) << i << "," << j;
    }
  EXPECT_TRUE(p.outside_untouched());
  Matrix wrong(4, 3);
  EXPECT_THROW(cpu_compute().adamw(k, g.view(), m.view(), wrong.view(), p.view()), Error);
}

}  // namespace
}  // namespace distmuon
