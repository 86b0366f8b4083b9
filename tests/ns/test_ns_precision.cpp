// Precision (precision.h): the operand rounding the CPU backends emulate, products at each
// precision, and Newton-Schulz's numerics per algorithm x precision x coefficient set x shape
// family against a float64 reference.
//
// Tolerances (relative Frobenius error against float64 standard NS with the same coefficients),
// and why. A precision's unit roundoff u (half its spacing at 1) is 2^-24 (fp32), 2^-11 (tf32),
// 2^-8 (bf16); every product accumulates in fp32, so the operands' rounding dominates. NS maps the
// singular values into its band whatever the perturbation, so the error does not compound step
// after step: measured (distmuon precision, docs/precision.md) standard NS ends 1-8 u away.
//  - standard: fp32 1e-5 (the fp32 tests' bound, tests/ns), tf32 1e-2 and bf16 8e-2 (about 20 u:
//    the largest measured was 3.5e-3 and 1.6e-2, cubic5 on the tiny matrix).
//  - gram: fp32 2e-4 (its fp32 bound, docs/gram-newton-schulz.md), tf32 2e-2, bf16 1.6e-1 (twice
//    standard's: the largest measured was 3.6e-3 and 2.9e-2, simple on the square matrix); and
//    at most kGramReducedPrecisionRatio (10) times standard NS's own error on the same input and
//    precision (the documented bound; measured at most 5.1, deepseekv4 in tf32 on 5x8).
// cans is left out of the numerics: its large coefficients amplify bf16 rounding on small square
// matrices (standard NS itself ends 1.7e2 away on a 16x16 input; docs/precision.md).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "compute/cpu/bf16_gemm.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"
#include "test_util.h"

namespace distmuon {
namespace {

constexpr Precision kPrecisions[] = {Precision::kFp32, Precision::kTf32, Precision::kBf16};

double tolerance(NsAlgorithm algorithm, Precision p) {
  const bool gram = algorithm == NsAlgorithm::kGram;
  if (p != Precision::kFp32) return test::reduced_precision_ns_bound(gram, p);
  return gram ? 2e-4 : 1e-5;
}

float from_bits(std::uint32_t b) {
  return std::bit_cast<float>(b);
}

TEST(Precision, NamesParseAndRefuseOthers) {
  for (const Precision p : kPrecisions)
    EXPECT_EQ(parse_precision(to_string(p)), p);
  EXPECT_STREQ(to_string(Precision::kBf16), "bf16");
  try {
    parse_precision("fp16");
    ADD_FAILURE() << "fp16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown precision 'fp16'; valid: fp32, tf32, bf16"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_precision("bf16-operands"), Error);
  EXPECT_THROW(parse_precision(""), Error);
}

// bf16: round to nearest even on 16 dropped bits; tf32: round to nearest, ties away from zero,
// on 13 dropped bits (cvt.rna.tf32.f32).
TEST(Precision, RoundingMatchesTheGpuConversions) {
  const float one = 1.0f;
  // bf16 spacing at 1 is 2^-7: 1 + 2^-8 is a tie to the even 1; 1 + 3 2^-8 a tie to 1 + 2^-6.
  EXPECT_EQ(round_to(Precision::kBf16, one + std::ldexp(1.0f, -8)), one);
  EXPECT_EQ(round_to(Precision::kBf16, one + 3 * std::ldexp(1.0f, -8)), one + std::ldexp(1.0f, -6));
  EXPECT_EQ(round_to(Precision::kBf16, one + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)),
            one + std::ldexp(1.0f, -7));
  EXPECT_EQ(round_to(Precision::kBf16, -(one + 3 * std::ldexp(1.0f, -8))),
            -(one + std::ldexp(1.0f, -6)));
  // tf32 spacing at 1 is 2^-10: the tie 1 + 2^-11 goes away from zero, on either sign.
  EXPECT_EQ(round_to(Precision::kTf32, one + std::ldexp(1.0f, -11)), one + std::ldexp(1.0f, -10));
  EXPECT_EQ(round_to(Precision::kTf32, -(one + std::ldexp(1.0f, -11))),
            -(one + std::ldexp(1.0f, -10)));
  EXPECT_EQ(round_to(Precision::kTf32, one + std::ldexp(1.0f, -12)), one);
  // Low bits cleared; fp32 unchanged; non-finite kept.
  const float x = from_bits(0x3fabcdefu);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(round_to(Precision::kBf16, x)) & 0xffffu, 0u);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(round_to(Precision::kTf32, x)) & 0x1fffu, 0u);
  EXPECT_EQ(round_to(Precision::kFp32, x), x);
  EXPECT_TRUE(std::isnan(round_to(Precision::kBf16, std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(round_to(Precision::kTf32, std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
}

// The host reference by its definition (newton_schulz.h): float64 and float agree to float's
// rounding (1e-5: ~100 unit roundoffs of accumulated sums over a few steps), a tall input is the
// transpose of its wide one's result, it is the cpu backend's fp32 NS (1e-5, that backend's
// own fp32 bound), and a size that does not match the shape is refused.
TEST(Precision, HostReferenceIsNewtonSchulzByItsDefinition) {
  const Matrix g = test::random_matrix(12, 5, 4);
  const CoefficientSet& set = coefficient_set("quintic");
  const Matrix d = test::reference_newton_schulz<double>(g.view(), set, 5, 1e-7);
  const Matrix f = test::reference_newton_schulz<float>(g.view(), set, 5, 1e-7);
  EXPECT_LE(relative_error(f.view(), d.view()), 1e-5);
  Matrix gt(5, 12);
  for (Index i = 0; i < 12; ++i)
    for (Index j = 0; j < 5; ++j)
      gt(j, i) = g(i, j);
  const Matrix dt = test::reference_newton_schulz<double>(gt.view(), set, 5, 1e-7);
  for (Index i = 0; i < 12; ++i)
    for (Index j = 0; j < 5; ++j)
      EXPECT_EQ(dt(j, i), d(i, j));
  NsOptions o;
  o.coefficients = set;
  o.steps = 5;
  EXPECT_LE(relative_error(newton_schulz(g.view(), o, cpu_compute()).view(), d.view()), 1e-5);
  const std::vector<double> three(3, 1.0);
  EXPECT_THROW((void)reference_newton_schulz<double>(three, 2, 2, set, 5, 1e-7), Error);
}

// Compute::round is round_to on every element of a strided view (ties, infinities and NaN
// included), the elements outside the view untouched, on the cpu and opaque backends.
TEST(Precision, RoundIsRoundToOnEveryElement) {
  Matrix full = test::random_matrix(6, 9, 3);
  const float one = 1.0f;
  full(0, 0) = one + std::ldexp(1.0f, -8);      // a bf16 tie: to even (1)
  full(0, 1) = one + 3 * std::ldexp(1.0f, -8);  // a bf16 tie: up
  full(0, 2) = -(one + std::ldexp(1.0f, -11));  // a tf32 tie: away from 0
  full(1, 0) = std::numeric_limits<float>::infinity();
  full(1, 1) = std::numeric_limits<float>::quiet_NaN();
  full(1, 2) = std::numeric_limits<float>::max();  // past bf16's largest: Inf
  auto opaque = make_opaque_compute();
  for (const Precision p : kPrecisions) {
    Matrix got = full;
    const MatrixView inner = got.view().block(0, 0, 6, 7);  // ld 9: two columns left alone
    cpu_compute().round(inner, p);
    DeviceMatrix d = to_device(*opaque, full.view());
    opaque->round(d.view(), p);
    const Matrix from_opaque = to_host(*opaque, d.view());
    for (Index i = 0; i < 6; ++i) {
      for (Index j = 0; j < 9; ++j) {
        const float want = j < 7 ? round_to(p, full(i, j)) : full(i, j);
        const auto bits = [](float v) { return std::bit_cast<std::uint32_t>(v); };
        EXPECT_EQ(bits(got(i, j)), bits(want)) << to_string(p) << " at " << i << "," << j;
        EXPECT_EQ(bits(from_opaque(i, j)), bits(round_to(p, full(i, j))))
            << "opaque " << to_string(p) << " at " << i << "," << j;
      }
    }
  }
}

// The emulation is sgemm on rounded copies: bit-equal to that, on the cpu and opaque backends,
// for gemm (b a distinct operand or a itself) and syrk; fp32 is the default argument. bf16 runs
// on oneDNN's bf16 kernels where the CPU has them (the same rounded operands, summed in fp32 in
// another order): within 1e-6 relative there (37 terms: at most 37 * 2^-24 = 2.2e-6 per element
// relative to the sum of the terms' magnitudes; measured 3e-8), and bit-equal when emulated.
TEST(Precision, ProductsAreSgemmOnRoundedOperands) {
  const Matrix a = test::random_matrix(13, 37, 1), b = test::random_matrix(37, 11, 2);
  auto opaque = make_opaque_compute();
  for (const Precision p : kPrecisions) {
    Matrix ra = a, rb = b;
    for (float& v : ra.values())
      v = round_to(p, v);
    for (float& v : rb.values())
      v = round_to(p, v);
    Matrix want(13, 11), got(13, 11);
    cpu_compute().gemm(Trans::kNo, Trans::kNo, 1.0f, ra.view(), rb.view(), 0.0f, want.view());
    cpu_compute().gemm(Trans::kNo, Trans::kNo, 1.0f, a.view(), b.view(), 0.0f, got.view(), p);
    const double tolerance = p == Precision::kBf16 && detail::onednn_bf16_enabled() ? 1e-6 : 0.0;
    EXPECT_LE(relative_error(got.view(), want.view()), tolerance) << to_string(p);
    // On the opaque backend: the cpu backend's bits.
    DeviceMatrix da = to_device(*opaque, a.view()), db = to_device(*opaque, b.view());
    DeviceMatrix dc(*opaque, 13, 11);
    opaque->gemm(Trans::kNo, Trans::kNo, 1.0f, da.view(), db.view(), 0.0f, dc.view(), p);
    EXPECT_EQ(relative_error(to_host(*opaque, dc.view()).view(), got.view()), 0.0);
    // syrk and the gemm of a with itself round one copy.
    Matrix s_want(13, 13), s_got(13, 13), g_got(13, 13);
    cpu_compute().syrk(Trans::kNo, 1.0f, ra.view(), 0.0f, s_want.view());
    cpu_compute().syrk(Trans::kNo, 1.0f, a.view(), 0.0f, s_got.view(), p);
    cpu_compute().gemm(Trans::kNo, Trans::kYes, 1.0f, a.view(), a.view(), 0.0f, g_got.view(), p);
    EXPECT_LE(relative_error(s_got.view(), s_want.view()), tolerance) << to_string(p);
    EXPECT_LE(relative_error(g_got.view(), s_want.view()), 1e-6) << to_string(p);
    if (p != Precision::kFp32) {
      Matrix fp32(13, 11);
      cpu_compute().gemm(Trans::kNo, Trans::kNo, 1.0f, a.view(), b.view(), 0.0f, fp32.view());
      EXPECT_GT(relative_error(got.view(), fp32.view()), 0.0) << to_string(p);
    }
  }
  EXPECT_EQ(cpu_compute().default_precision(), Precision::kFp32);
  EXPECT_EQ(opaque->default_precision(), Precision::kFp32);
}

// The rounded copies (and oneDNN's working memory) are scratch the backend keeps: once grown,
// products allocate nothing.
TEST(Precision, ScratchIsKeptAcrossProducts) {
  const Matrix a = test::random_matrix(40, 50, 3);
  Matrix c(40, 40);
  cpu_compute().syrk(Trans::kNo, 1.0f, a.view(), 0.0f, c.view(), Precision::kBf16);
  cpu_compute().syrk(Trans::kNo, 1.0f, a.view(), 0.0f, c.view(), Precision::kTf32);
  cpu_compute().gemm(Trans::kNo, Trans::kYes, 1.0f, a.view(), a.view(), 0.0f, c.view(),
                     Precision::kBf16);
  cpu_compute().gemm(Trans::kYes, Trans::kNo, 1.0f, a.view(), a.view(), 0.0f,
                     Matrix(50, 50).view(), Precision::kBf16);
  const MemoryStats before = cpu_compute().memory_stats();
  for (int i = 0; i < 3; ++i) {
    cpu_compute().syrk(Trans::kNo, 1.0f, a.view(), 0.0f, c.view(), Precision::kTf32);
    cpu_compute().gemm(Trans::kYes, Trans::kNo, 1.0f, a.view(), a.view(), 0.0f,
                       Matrix(50, 50).view(), Precision::kBf16);
  }
  EXPECT_EQ(cpu_compute().memory_stats().allocations, before.allocations);
}

struct Shape {
  const char* family;
  Index m, n;
};
// Square (the case with singular values near zero), tall, wide and tiny.
constexpr Shape kShapes[] = {
    {"square", 48, 48}, {"tall", 96, 40}, {"wide", 40, 96}, {"tiny", 5, 8}};
const char* const kSets[] = {"quintic", "polar_express", "cubic5", "simple", "deepseekv4"};

NsOptions options_for(const std::string& set, NsAlgorithm algorithm, Precision p) {
  NsOptions o;
  o.coefficients = coefficient_set(set);
  o.steps = set == "polar_express" ? 8 : (set == "deepseekv4" ? 10 : 5);
  o.algorithm = algorithm;
  o.precision = p;
  return o;
}

TEST(PrecisionNewtonSchulz, EveryAlgorithmPrecisionSetAndShapeAgainstFloat64) {
  for (const char* set : kSets) {
    for (const Shape& sh : kShapes) {
      const Matrix g = test::random_matrix(sh.m, sh.n, 29 + static_cast<std::uint64_t>(sh.m));
      const NsOptions ref_opts = options_for(set, NsAlgorithm::kStandard, Precision::kFp32);
      const Matrix ref =
          test::reference_newton_schulz<double>(g.view(), ref_opts.coefficients, ref_opts.steps);
      for (const Precision p : kPrecisions) {
        double standard_error = 0;
        for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
          for (const bool syrk : {true, false}) {
            NsOptions o = options_for(set, algorithm, p);
            o.use_syrk = syrk;
            const Matrix got = newton_schulz(g.view(), o, cpu_compute());
            const double err = relative_error(got.view(), ref.view());
            const std::string what =
                fmt::format("{} {} {} {} {} syrk {}", set, sh.family, shape_str(sh.m, sh.n),
                            to_string(algorithm), to_string(p), syrk);
            EXPECT_LE(err, tolerance(algorithm, p)) << what;
            if (algorithm == NsAlgorithm::kStandard && syrk) standard_error = err;
            if (algorithm == NsAlgorithm::kGram && p != Precision::kFp32) {
              EXPECT_LE(err, kGramReducedPrecisionRatio * standard_error) << what;
            }
            // The precision is honoured: tf32 and bf16 differ from fp32 by their rounding.
            if (p != Precision::kFp32 && algorithm == NsAlgorithm::kStandard) {
              EXPECT_GT(err, 1e-5) << what;
            }
          }
        }
      }
    }
  }
}

// The automatic restarts follow the precision's growth limit.
TEST(PrecisionNewtonSchulz, GramRestartsDependOnThePrecision) {
  EXPECT_EQ(gram_growth_limit(Precision::kFp32), kGramGrowthLimit);
  EXPECT_EQ(gram_growth_limit(Precision::kTf32), kGramGrowthLimitTf32);
  EXPECT_EQ(gram_growth_limit(Precision::kBf16), kGramGrowthLimitBf16);
  // simple: a^2 = 11.86 per step: fp32 never restarts in 5 steps (11.86^4 = 1.98e4 < 5e4), bf16
  // and tf32 after every second step.
  for (const Precision p : kPrecisions) {
    const NsOptions o = options_for("simple", NsAlgorithm::kGram, p);
    for (int step = 0; step < o.steps; ++step) {
      const bool want = p != Precision::kFp32 && (step == 1 || step == 3);
      EXPECT_EQ(gram_restarts_after(o, step), want) << to_string(p) << " step " << step;
    }
  }
  // quintic (a^2 = 16.7, 15.6, 14.0, 8.3, 8.0): in bf16 after each of the first three steps.
  const NsOptions q = options_for("quintic", NsAlgorithm::kGram, Precision::kBf16);
  EXPECT_EQ(gram_ns_gram_count(q), 4);
  EXPECT_EQ(gram_ns_gram_count(options_for("quintic", NsAlgorithm::kGram, Precision::kFp32)), 1);
  // An explicit period overrides the rule at every precision.
  NsOptions every2 = q;
  every2.gram_restart = 2;
  EXPECT_EQ(gram_ns_gram_count(every2), 3);
}

}  // namespace
}  // namespace distmuon
