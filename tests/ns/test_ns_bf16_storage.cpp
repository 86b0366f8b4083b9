// Compute::newton_schulz_bf16 on the CPU and opaque backends: the emulation of the CUDA backend's
// bf16-storage iteration (the order torch.optim.Muon's NS runs in), which the precision bounds of
// docs/precision.md are measured on.
//
// Tolerances, and why. The reference below evaluates the same order in double with a bf16
// rounding after each product's epilogue; the backend accumulates in fp32 in its own order (at
// most k 2^-24 of the sum of the k terms' magnitudes, k <= 40 here), so an output element can land
// on the neighbouring bf16 value where the exact sum is within that distance of a rounding tie,
// and a neighbour in A or B moves later outputs by about one bf16 unit in the rows it touches
// (a probability of about k 2^-24 / 2^-8, under 1e-3 per element). So: every element within
// two bf16 spacings (2^-6 relative to the largest element) of the reference, and at least 99% of
// them equal to it bit for bit. Measured: 100% on every case (oneDNN and the emulation alike);
// the same reference without B's rounding (B kept in fp32) matched only 95.1-96.5%, and every
// result's elements are checked to be on the bf16 grid (EveryIterateIsStoredInBf16).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"
#include "test_util.h"

namespace distmuon {
namespace {

double bf16(double v) {
  return round_to(Precision::kBf16, static_cast<float>(v));  // v is an fp32 sum here
}

// One step of the bf16-storage order in double, rounded to bf16 where the GPU writes bf16:
// X = bf16(x); A = bf16(X X^T); B = bf16(c A A + b A) (or A when c = 0); X' = bf16(s B X + a X).
Matrix one_step_reference(ConstMatrixView x, bool rows, NsStep k) {
  const Index m = x.rows, n = x.cols, s = rows ? m : n, l = rows ? n : m;
  auto at = [&](Index i, Index j) {  // op(X)(i, j), s x l, bf16
    return bf16(rows ? x(i, j) : x(j, i));
  };
  std::vector<double> a(s * s), b(s * s);
  for (Index i = 0; i < s; ++i)
    for (Index j = 0; j < s; ++j) {
      double sum = 0;
      for (Index t = 0; t < l; ++t)
        sum += at(i, t) * at(j, t);
      a[i * s + j] = bf16(sum);
    }
  const bool cubic = k.c == 0.0f;
  for (Index i = 0; i < s; ++i)
    for (Index j = 0; j < s; ++j) {
      double sum = 0;
      for (Index t = 0; t < s; ++t)
        sum += a[i * s + t] * a[t * s + j];
      b[i * s + j] = cubic ? a[i * s + j] : bf16(double(k.c) * sum + double(k.b) * a[i * s + j]);
    }
  const double alpha = cubic ? k.b : 1.0;
  Matrix out(m, n);
  for (Index i = 0; i < s; ++i)
    for (Index j = 0; j < l; ++j) {
      double sum = 0;
      for (Index t = 0; t < s; ++t)
        sum += b[i * s + t] * at(t, j);
      const double v = bf16(alpha * sum + double(k.a) * at(i, j));
      (rows ? out(i, j) : out(j, i)) = static_cast<float>(v);
    }
  return out;
}

Matrix normalised(Index m, Index n, std::uint64_t seed) {
  Matrix g = test::random_matrix(m, n, seed);
  cpu_compute().normalize(g.view(), 1e-7, true, nullptr);
  return g;
}

void run(Compute& compute, std::vector<MatrixView> xs, bool rows, std::span<const NsStep> steps,
         bool syrk) {
  const Index m = xs[0].rows, n = xs[0].cols;
  DeviceMatrix scratch(compute, 1,
                       ns_bf16_scratch_floats(static_cast<Index>(xs.size()), m, n, rows));
  compute.newton_schulz_bf16(xs, rows, steps, syrk, scratch.view());
}

TEST(NsBf16Storage, OneStepFollowsTheRoundingOrder) {
  const NsStep quintic{3.4445f, -4.7750f, 2.0315f}, cubic{1.5f, -0.5f, 0.0f};
  for (const NsStep k : {quintic, cubic}) {
    for (const bool rows : {true, false}) {
      for (const bool syrk : {true, false}) {
        const Matrix x = normalised(rows ? 24 : 40, rows ? 40 : 24, 5);
        const Matrix want = one_step_reference(x.view(), rows, k);
        Matrix got = x;
        run(cpu_compute(), {got.view()}, rows, std::span<const NsStep>(&k, 1), syrk);
        Index equal = 0;
        double worst = 0, largest = 0;
        for (Index i = 0; i < got.rows(); ++i)
          for (Index j = 0; j < got.cols(); ++j) {
            equal += got(i, j) == want(i, j);
            worst = std::max(worst, std::abs(double(got(i, j)) - want(i, j)));
            largest = std::max(largest, std::abs(double(want(i, j))));
          }
        const double share = double(equal) / double(got.size());
        const std::string what =
            fmt::format("c {} rows {} syrk {}: {:.1f}% bit-equal, worst {:.2e}", k.c, rows, syrk,
                        100 * share, worst / largest);
        std::printf("%s\n", what.c_str());
        EXPECT_LE(worst, std::ldexp(largest, -6)) << what;
        EXPECT_GE(share, 0.99) << what;
      }
    }
  }
}

TEST(NsBf16Storage, EveryIterateIsStoredInBf16) {
  NsOptions o;
  o.precision = Precision::kBf16;
  for (const auto [m, n] : {std::pair<Index, Index>{32, 48}, {48, 32}}) {
    const Matrix got = newton_schulz(test::random_matrix(m, n, 3).view(), o, cpu_compute());
    for (Index i = 0; i < m; ++i)
      for (Index j = 0; j < n; ++j)
        ASSERT_EQ(round_to(Precision::kBf16, got(i, j)), got(i, j)) << i << ", " << j;
  }
}

// newton_schulz at bf16 without a group is the normalisation, then this operation.
TEST(NsBf16Storage, NewtonSchulzAtBf16IsThisOperation) {
  NsOptions o;
  o.precision = Precision::kBf16;
  const Matrix g = test::random_matrix(20, 36, 11);
  const Matrix got = newton_schulz(g.view(), o, cpu_compute());
  Matrix want = g;
  cpu_compute().normalize(want.view(), o.eps, o.norm_in_double, nullptr);
  std::vector<NsStep> steps;
  for (int i = 0; i < o.steps; ++i) {
    const NsCoefficients& k = o.coefficients.at(i);
    steps.push_back({float(k.a), float(k.b), float(k.c)});
  }
  run(cpu_compute(), {want.view()}, true, steps, o.use_syrk);
  EXPECT_EQ(relative_error(got.view(), want.view()), 0.0);
}

// A batch is its matrices one by one (cpu); the opaque backend passes the call through to the
// cpu's, bit for bit.
TEST(NsBf16Storage, BatchAndOpaqueAreTheCpuOneByOne) {
  const NsStep steps[] = {{3.4445f, -4.7750f, 2.0315f}, {1.5f, -0.5f, 0.0f}};
  Matrix x0 = normalised(16, 28, 1), x1 = normalised(16, 28, 2);
  Matrix one0 = x0, one1 = x1;
  run(cpu_compute(), {one0.view()}, false, steps, true);
  run(cpu_compute(), {one1.view()}, false, steps, true);
  run(cpu_compute(), {x0.view(), x1.view()}, false, steps, true);
  EXPECT_EQ(relative_error(x0.view(), one0.view()), 0.0);
  EXPECT_EQ(relative_error(x1.view(), one1.view()), 0.0);

  auto opaque = make_opaque_compute();
  Matrix y0 = normalised(16, 28, 1), y1 = normalised(16, 28, 2);
  DeviceMatrix d0 = to_device(*opaque, y0.view()), d1 = to_device(*opaque, y1.view());
  run(*opaque, {d0.view(), d1.view()}, false, steps, true);
  EXPECT_EQ(relative_error(to_host(*opaque, d0.view()).view(), one0.view()), 0.0);
  EXPECT_EQ(relative_error(to_host(*opaque, d1.view()).view(), one1.view()), 0.0);
}

TEST(NsBf16Storage, RefusesMixedShapesAndShortScratch) {
  const NsStep k{1.5f, -0.5f, 0.0f};
  Matrix a(4, 6), b(6, 4);
  Matrix scratch(1, ns_bf16_scratch_floats(2, 4, 6, true));
  std::vector<MatrixView> mixed{a.view(), b.view()};
  EXPECT_THROW(cpu_compute().newton_schulz_bf16(mixed, true, std::span<const NsStep>(&k, 1), true,
                                                scratch.view()),
               Error);
  std::vector<MatrixView> one{a.view()};
  Matrix short_scratch(1, ns_bf16_scratch_floats(1, 4, 6, true) - 1);
  EXPECT_THROW(cpu_compute().newton_schulz_bf16(one, true, std::span<const NsStep>(&k, 1), true,
                                                short_scratch.view()),
               Error);
}

}  // namespace
}  // namespace distmuon
