// The CPU backend's elementwise operations (fill, copy, the finite check, Muon's momentum step,
// AdamW's step) against independent references, on strided views so that the leading dimension
// is honoured and the elements outside a view are left alone; its fused Muon passes
// (muon_directions, muon_apply) against the separate operations they fuse (Compute's defaults).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

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

// A rows x cols view inside a buffer 3 columns wider (ld = cols + 3), Gaussian values.
struct Wide {
  Matrix buf;
  Index cols;
  Wide(Index rows, Index c, unsigned seed, float scale = 1.0f) : buf(rows, c + 3), cols(c) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    for (float& v : buf.values())
      v = d(rng);
  }
  MatrixView view() { return buf.view().block(0, 0, buf.rows(), cols); }
};

bool same_bits(const Matrix& a, const Matrix& b) {
  return a.values().size() == b.values().size() &&
         std::memcmp(a.data(), b.data(), a.values().size() * sizeof(float)) == 0;
}

bool same_found(const std::vector<std::optional<MatrixIndex>>& a,
                const std::vector<std::optional<MatrixIndex>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (a[k].has_value() != b[k].has_value()) return false;
    if (a[k] && (a[k]->row != b[k]->row || a[k]->col != b[k]->col)) return false;
  }
  return true;
}

// One muon_directions call of two directions (13 x 21: the 8-lane body and its tail; 3 padding
// rows unchecked) and one other view on the CPU backend and through Compute's default (the
// separate operations): the same bits in every u, every sum and every result. sums_only: the
// first direction's u is not stored (its sums are the same).
struct Directions {
  Wide g{13, 21, 1}, w{13, 21, 2}, buf{13, 21, 3}, g2{13, 21, 4}, w2{13, 21, 5}, buf2{13, 21, 6},
      other{4, 5, 7};
  std::vector<std::optional<MatrixIndex>> found;
  std::vector<double> sums;
  Matrix u, u2;
  void run(const MomentumStep& k, bool fused, bool sums_only = false) {
    Wide out(13, 21, 8), out2(13, 21, 9);
    const MuonDirection dirs[] = {{g.view(), w.view(), buf.view(), out.view(), 10, true, sums_only},
                                  {g2.view(), w2.view(), buf2.view(), out2.view(), 10, false}};
    const ConstMatrixView others[] = {other.view()};
    found.assign(7, MatrixIndex{-1, -1});
    sums.assign(2, -1.0);
    Compute& cpu = cpu_compute();
    if (fused) {
      cpu.muon_directions(k, dirs, others, found, sums);
    } else {
      cpu.Compute::muon_directions(k, dirs, others, found, sums);
    }
    u = out.buf;
    u2 = out2.buf;
  }
};

TEST(CpuComputeElementwise, FusedMuonDirectionsEqualTheSeparateOperations) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kBig = 3.4e38f;
  for (const bool nesterov : {true, false}) {
    for (const float l2 : {0.0f, 0.1f}) {
      const MomentumStep k{0.95f, l2, nesterov};
      // Each case: a value planted (or none), and where the fused pass must find it.
      struct Plant {
        const char* what;
        int input;  // 0 g, 1 w, 2 buf of the first direction, 3 buf of the second, 4 other
        Index row, col;
        float value;
      };
      for (const Plant& c : {Plant{"finite", -1, 0, 0, 0.0f}, Plant{"NaN in g", 0, 4, 20, kNaN},
                             Plant{"inf in w", 1, 9, 3, kInf}, Plant{"-inf in buf", 2, 0, 0, -kInf},
                             Plant{"NaN in the second buf", 3, 7, 8, kNaN},
                             Plant{"inf in a padding row (unchecked)", 0, 11, 2, kInf},
                             Plant{"NaN in the other", 4, 3, 4, kNaN},
                             Plant{"finite inputs whose u overflows (l2)", 0, 5, 5, kBig}}) {
        SCOPED_TRACE(testing::Message() << c.what << ", nesterov " << nesterov << ", l2 " << l2);
        Directions fused, separate;
        for (Directions* d : {&fused, &separate}) {
          Wide* target[] = {&d->g, &d->w, &d->buf, &d->buf2, &d->other};
          if (c.input >= 0) target[c.input]->buf(c.row, c.col) = c.value;
          if (c.value == kBig) d->w.buf(c.row, c.col) = kBig;  // g + l2 w: past the range
        }
        Directions only = fused;
        fused.run(k, true);
        separate.run(k, false);
        only.run(k, true, true);  // the CPU backend leaves u unwritten: the same sums and results
        EXPECT_TRUE(same_bits(only.u, Wide(13, 21, 8).buf));
        EXPECT_TRUE(same_bits(only.u2, separate.u2));
        EXPECT_TRUE(same_found(only.found, separate.found));
        EXPECT_EQ(std::memcmp(only.sums.data(), separate.sums.data(), 2 * sizeof(double)), 0);
        EXPECT_TRUE(same_bits(fused.u, separate.u));
        EXPECT_TRUE(same_bits(fused.u2, separate.u2));
        EXPECT_TRUE(same_found(fused.found, separate.found));
        ASSERT_EQ(fused.sums.size(), 2u);
        for (int s = 0; s < 2; ++s) {  // NaN sums compare by their bits
          EXPECT_EQ(std::memcmp(&fused.sums[s], &separate.sums[s], sizeof(double)), 0);
        }
        // Where the separate operations find the planted value: its place (0 g, 1 w, 2 buf; 3 to
        // 5 the second direction's; 6 the other).
        const int slot[] = {0, 1, 2, 5, 6};
        for (std::size_t r = 0; r < fused.found.size(); ++r) {
          const bool planted = c.input >= 0 && !std::isfinite(c.value) && c.row < 10 &&
                               static_cast<int>(r) == slot[c.input];
          EXPECT_EQ(fused.found[r].has_value(), planted) << r;
          if (planted && fused.found[r]) {
            EXPECT_EQ(fused.found[r]->row, c.row);
            EXPECT_EQ(fused.found[r]->col, c.col);
          }
        }
        if (c.value == kBig && l2 != 0) EXPECT_FALSE(std::isfinite(fused.sums[1]));  // u overflowed
      }
    }
  }
  // Shapes and counts are checked.
  Directions d;
  Wide out(13, 20, 1);
  const MuonDirection bad[] = {{d.g.view(), d.w.view(), d.buf.view(), out.view(), 10, false}};
  std::vector<std::optional<MatrixIndex>> found(3);
  EXPECT_THROW(cpu_compute().muon_directions({}, bad, {}, found, {}), Error);
}

TEST(CpuComputeElementwise, FusedMuonApplyEqualsTheSeparateOperations) {
  for (const bool nesterov : {true, false}) {
    for (const float l2 : {0.0f, 0.1f}) {
      for (const float decay : {1.0f, 0.999f, 0.0f}) {
        SCOPED_TRACE(testing::Message()
                     << "nesterov " << nesterov << ", l2 " << l2 << ", decay " << decay);
        const MomentumStep k{0.9f, l2, nesterov};
        Wide g(13, 21, 1), u(13, 21, 2), w(13, 21, 3), buf(13, 21, 4);
        Wide w2 = w, buf2 = buf;
        cpu_compute().muon_apply(k, g.view(), w.view(), buf.view(), u.view(), decay, 0.02f);
        cpu_compute().Compute::muon_apply(k, g.view(), w2.view(), buf2.view(), u.view(), decay,
                                          0.02f);
        EXPECT_TRUE(same_bits(w.buf, w2.buf));
        EXPECT_TRUE(same_bits(buf.buf, buf2.buf));
        EXPECT_FALSE(same_bits(w.buf, Wide(13, 21, 3).buf));  // it stepped
      }
    }
  }
  Matrix g(4, 4), w(4, 4), buf(4, 4), u(4, 3);
  EXPECT_THROW(cpu_compute().muon_apply({}, g.view(), w.view(), buf.view(), u.view(), 1.0f, 0.1f),
               Error);
}

}  // namespace
}  // namespace distmuon
