// The coefficient-schedule check (newton_schulz.h, check_schedule): every built-in set at 1-12
// steps and random custom schedules are either refused with a clear error, or orthogonalise real
// matrices (tall, wide, square) into their documented band, aligned with the polar factor:
// cosine > 0.99 wherever the band allows it (hi / lo <= 1.33: quintic, polar_express, cans,
// deepseekv4, custom), and at least the band's own bound for the two published designs with a
// wider band (simple 0.954, cubic5 0.964; docs/optimizer.md).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/singular_values.h"
#include "test_util.h"

namespace distmuon {
namespace {

// Q (rows x cols, rows >= cols) with orthonormal columns: Gram-Schmidt (twice) in double.
test::DMatrix orthonormal(Index rows, Index cols, std::uint64_t seed) {
  const Matrix g = test::random_matrix(rows, cols, seed);
  test::DMatrix q{rows, cols, std::vector<double>(static_cast<std::size_t>(rows * cols))};
  for (Index j = 0; j < cols; ++j) {
    for (Index i = 0; i < rows; ++i)
      q(i, j) = g(i, j);
    for (int pass = 0; pass < 2; ++pass) {
      for (Index k = 0; k < j; ++k) {
        double d = 0;
        for (Index i = 0; i < rows; ++i)
          d += q(i, k) * q(i, j);
        for (Index i = 0; i < rows; ++i)
          q(i, j) -= d * q(i, k);
      }
    }
    double n = 0;
    for (Index i = 0; i < rows; ++i)
      n += q(i, j) * q(i, j);
    for (Index i = 0; i < rows; ++i)
      q(i, j) /= std::sqrt(n);
  }
  return q;
}

// G = U diag(s) V^T with known factors, and the polar factor U V^T.
struct Known {
  Matrix g, polar;
  double sigma_min = 0;  // the smallest singular value of G / ||G||_F
};

// s spread log-uniformly so that every normalised singular value is >= kScheduleSigmaFloor (the
// band is promised there); `tiny` adds one direction at 1e-4 (below the floor: positive and under
// the band's top, which the check also requires).
Known known_matrix(Index m, Index n, std::uint64_t seed, bool tiny) {
  const Index r = std::min(m, n);
  const test::DMatrix u = orthonormal(m, r, seed);
  const test::DMatrix v = orthonormal(n, r, seed + 1000);
  std::vector<double> s(static_cast<std::size_t>(r));
  for (Index i = 0; i < r; ++i)
    s[static_cast<std::size_t>(i)] = std::pow(10.0, -1.0 * static_cast<double>(i) / (r - 1));
  double fro = 0;
  for (double x : s)
    fro += x * x;
  fro = std::sqrt(fro);
  if (tiny) s.back() = 1e-4 * fro;
  Known k{Matrix(m, n), Matrix(m, n), 1.0};
  for (Index i = 0; i < m; ++i) {
    for (Index j = 0; j < n; ++j) {
      double gij = 0, pij = 0;
      for (Index t = 0; t < r; ++t) {
        gij += u(i, t) * s[static_cast<std::size_t>(t)] * v(j, t);
        pij += u(i, t) * v(j, t);
      }
      k.g(i, j) = static_cast<float>(gij);
      k.polar(i, j) = static_cast<float>(pij);
    }
  }
  double f2 = 0;
  for (double x : s)
    f2 += x * x;
  for (double x : s)
    k.sigma_min = std::min(k.sigma_min, x / std::sqrt(f2));
  return k;
}

double cosine(ConstMatrixView a, ConstMatrixView b) {
  double ab = 0, aa = 0, bb = 0;
  for (Index i = 0; i < a.rows; ++i) {
    for (Index j = 0; j < a.cols; ++j) {
      ab += double(a(i, j)) * b(i, j);
      aa += double(a(i, j)) * a(i, j);
      bb += double(b(i, j)) * b(i, j);
    }
  }
  return ab / std::sqrt(aa * bb);
}

struct Shape {
  Index m, n;
  bool tiny;
};
// Tall, wide, square (the square one with a direction below the floor).
const Shape kShapes[] = {{40, 16}, {16, 40}, {24, 24, true}};

// fp32 NS against the float64 composed polynomials: the results differ by ~1e-5 relative on
// these sizes (NewtonSchulz.MatchesFloat64ReferenceForEverySetAndShape), amplified by |p'| of up
// to ~26 per step for the first polar_express/cans steps near sigma = 1 (here sigma <= 0.6): 0.01
// on the band edges is far above that and far below any schedule error the check is for.
constexpr double kBandTolerance = 0.01;

// The smallest cosine with U V^T that singular values anywhere in [lo, hi] can give (half of them
// at each end): (lo + hi) / sqrt(2 (lo^2 + hi^2)).
double band_alignment(const CoefficientSet& set) {
  const double lo = set.band_lo, hi = set.band_hi;
  return (lo + hi) / std::sqrt(2 * (lo * lo + hi * hi));
}

// Refused with an error naming the set, the step count and the supported step counts; or an
// orthogonalisation aligned with the polar factor (cosine > 0.99, or the band's bound where that
// is lower) inside the band.
// Returns whether the schedule was accepted.
bool refused_clearly_or_orthogonalises(const CoefficientSet& set, int steps,
                                       const std::string& label) {
  NsOptions o;
  o.coefficients = set;
  o.steps = steps;
  std::string error;
  try {
    o.validate();
  } catch (const Error& e) {
    error = e.what();
  }
  if (!error.empty()) {
    EXPECT_NE(error.find("'" + set.name + "'"), std::string::npos) << label << ": " << error;
    EXPECT_NE(error.find(std::to_string(steps) + " steps"), std::string::npos) << label << error;
    EXPECT_NE(error.find("supports"), std::string::npos) << label << ": " << error;
    // Every API refuses it: the C++ newton_schulz before any work.
    const Matrix g = test::random_matrix(8, 6, 1);
    EXPECT_THROW(newton_schulz(g.view(), o, cpu_compute()), Error) << label;
    return false;
  }
  std::uint64_t seed = 11;
  for (const Shape& sh : kShapes) {
    const Known k = known_matrix(sh.m, sh.n, seed++, sh.tiny);
    const Matrix x = newton_schulz(k.g.view(), o, cpu_compute());
    // The tiny direction (1 of r) is left near 0 by any few-step schedule: at most sqrt((r-1)/r)
    // of the cosine remains, with the others anywhere in the band.
    const double r = static_cast<double>(std::min(sh.m, sh.n));
    const double bound =
        std::min(0.99, band_alignment(set)) * (sh.tiny ? std::sqrt((r - 1) / r) : 1.0);
    EXPECT_GT(cosine(x.view(), k.polar.view()), bound) << label << " " << shape_str(sh.m, sh.n);
    const std::vector<double> sv = singular_values(x.view());
    EXPECT_LE(sv.front(), set.band_hi + kBandTolerance) << label << " " << shape_str(sh.m, sh.n);
    // The smallest is the tiny direction (below the floor, no lower bound) on the square shape.
    const double lowest = sh.tiny ? sv[sv.size() - 2] : sv.back();
    EXPECT_GE(lowest, set.band_lo - kBandTolerance) << label << " " << shape_str(sh.m, sh.n);
    if (sh.tiny) EXPECT_GT(sv.back(), 0.0) << label;
  }
  return true;
}

TEST(NsSchedules, EveryBuiltInSetAtOneToTwelveSteps) {
  int accepted = 0;
  for (const std::string& name : coefficient_set_names()) {
    if (name == "custom") continue;
    for (int steps = 1; steps <= 12; ++steps) {
      const CoefficientSet& set = coefficient_set(name);
      if (set.required_steps && steps != *set.required_steps) continue;  // validate_steps
      accepted += refused_clearly_or_orthogonalises(set, steps, name + "@" + std::to_string(steps));
    }
  }
  // Every band but simple's and cubic5's guarantees 0.99 (docs/optimizer.md).
  EXPECT_GE(band_alignment(coefficient_set("quintic")), 0.99);
  EXPECT_GE(band_alignment(coefficient_set("polar_express")), 0.99);
  EXPECT_GE(band_alignment(coefficient_set("cans")), 0.99);
  EXPECT_GE(band_alignment(coefficient_set("deepseekv4")), 0.99);
  EXPECT_GE(band_alignment(custom_coefficients({{1, 0, 0}})), 0.99);
  // The check's verdicts: simple 4-12, quintic 4-5 and 9-10, polar_express and cans 5-12,
  // deepseekv4 10-12, cubic5 at 5 (its only step count), aol 4, 8 and 12 with its AOL input
  // scaling (36 of 67 accepted).
  EXPECT_EQ(accepted, 9 + 4 + 8 + 8 + 3 + 1 + 3);
}

TEST(NsSchedules, RandomCustomSchedules) {
  std::mt19937_64 rng(2024);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> steps_of(1, 12), tuples_of(1, 5);
  // Published tables at their step counts (as custom tables, cycled), each coefficient perturbed
  // by ~0.5%: near the band's edges some stay in, some fall out.
  struct Base {
    const char* name;
    int steps;
  };
  const Base bases[] = {{"quintic", 5}, {"quintic", 4},     {"polar_express", 8},
                        {"cans", 5},    {"deepseekv4", 10}, {"simple", 6}};
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<NsCoefficients> table;
    int steps = 0;
    if (trial % 2 == 0) {
      const Base& b = bases[static_cast<std::size_t>(trial / 2) % std::size(bases)];
      for (NsCoefficients c : coefficient_set(b.name).table) {
        c.a *= 1 + 0.005 * noise(rng);
        c.b *= 1 + 0.005 * noise(rng);
        c.c *= 1 + 0.005 * noise(rng);
        table.push_back(c);
      }
      steps = b.steps;
    } else {  // anything in the range of the published coefficients
      const int n = tuples_of(rng);
      for (int t = 0; t < n; ++t)
        table.push_back({-2 + 12 * unit(rng), -30 + 35 * unit(rng), -5 + 25 * unit(rng)});
      steps = steps_of(rng);
    }
    const bool ok = refused_clearly_or_orthogonalises(custom_coefficients(table), steps,
                                                      "trial " + std::to_string(trial));
    ++(ok ? accepted : refused);
  }
  // Both outcomes are exercised (a property test that only ever refuses proves nothing).
  EXPECT_GE(accepted, 5);  // seed 2024: 9 of 60
  EXPECT_GE(refused, 20);
  std::printf("  random custom schedules: %d accepted, %d refused\n", accepted, refused);
}

TEST(NsSchedules, APublishedTableGivenAsCustomKeepsItsSetsBand) {
  // torch.optim.Muon's default tuple is simple's table: accepted at 5 steps in simple's band
  // ([0.65, 1.25]; the custom band [0.86, 1.14] would refuse it, its values reach 0.68).
  const CoefficientSet torch_default = custom_coefficients({{3.4445, -4.7750, 2.0315}});
  EXPECT_EQ(torch_default.band_lo, coefficient_set("simple").band_lo);
  EXPECT_EQ(torch_default.band_hi, coefficient_set("simple").band_hi);
  EXPECT_TRUE(refused_clearly_or_orthogonalises(torch_default, 5, "torch default"));
  EXPECT_EQ(supported_steps(torch_default), supported_steps(coefficient_set("simple")));
  // cubic5's table keeps its one step count; a table differing in one digit is a custom one.
  EXPECT_EQ(custom_coefficients(coefficient_set("cubic5").table).required_steps, 5);
  const CoefficientSet near_default = custom_coefficients({{3.4445, -4.7750, 2.0316}});
  EXPECT_EQ(near_default.band_lo, kCustomBandLo);
  EXPECT_FALSE(refused_clearly_or_orthogonalises(near_default, 5, "near torch default"));
}

// The composed schedule in double at sigma.
double composed(const CoefficientSet& set, int steps, double sigma) {
  double x = sigma;
  for (int k = 0; k < steps; ++k) {
    const NsCoefficients& t = set.at(k);
    x = x * (t.a + x * x * (t.b + x * x * t.c));
  }
  return x;
}

// A first step negative only on (0.50005, 0.50015), narrower than the check's grid spacing of
// 1/4096 and between two of its points, then quintic and a converging tail: every grid point ends
// in [0.98, 1], but sigma = 0.5001 ends near -0.47 (a reversed direction). The check bounds each
// step's polynomial over whole intervals and refuses it.
TEST(NsSchedules, ADipBetweenTheGridPointsIsRefused) {
  const double al = 0.50005 * 0.50005, be = 0.50015 * 0.50015;
  const double k = 1.0 / (al * be - (al + be) + 1.0);  // p(1) = 1
  std::vector<NsCoefficients> table{{al * be * k, -(al + be) * k, k}};
  table.insert(table.end(), 12, {3.4445, -4.7750, 2.0315});
  table.insert(table.end(), 7, {1.875, -1.25, 0.375});
  const CoefficientSet set = custom_coefficients(table);
  ASSERT_LT(composed(set, 20, 0.5001), -0.4);  // the schedule really reverses it
  const ScheduleCheck c = check_schedule(set, 20);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("reversed or cancelled"), std::string::npos) << c.problem;
  EXPECT_NE(c.problem.find("at step 1"), std::string::npos) << c.problem;
}

// Property: no schedule the check accepts reverses or blows up a direction anywhere in
// [1e-6, 1] (the normalised input's singular values), in exact (double) arithmetic: 300 random
// schedules (narrow dips like the one above at random places, published tables perturbed by up to
// 0.5%, arbitrary tables), each accepted one evaluated at 20000 random singular values.
TEST(NsSchedules, NoAcceptedScheduleReversesOrBlowsUpADirection) {
  std::mt19937_64 rng(35);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> steps_of(1, 20);
  int accepted = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<NsCoefficients> table;
    if (trial % 3 == 0) {  // a narrow dip at a random place, then a converging tail
      const double r = 0.02 + 0.95 * unit(rng), w = 1e-5 + 2e-4 * unit(rng);
      const double al = r * r, be = (r + w) * (r + w);
      const double k = 1.0 / (al * be - (al + be) + 1.0);
      table.push_back({al * be * k, -(al + be) * k, k});
      table.insert(table.end(), 12, {3.4445, -4.7750, 2.0315});
      table.insert(table.end(), 7, {1.875, -1.25, 0.375});
    } else if (trial % 3 == 1) {  // a published table perturbed by ~0.5%, at 5 to 20 steps
      const char* names[] = {"quintic", "polar_express", "cans", "deepseekv4", "simple"};
      for (NsCoefficients c : coefficient_set(names[trial % 5]).table) {
        c.a *= 1 + 0.01 * (unit(rng) - 0.5);
        c.b *= 1 + 0.01 * (unit(rng) - 0.5);
        c.c *= 1 + 0.01 * (unit(rng) - 0.5);
        table.push_back(c);
      }
    } else {
      const int n = 1 + static_cast<int>(5 * unit(rng));
      for (int t = 0; t < n; ++t)
        table.push_back({-2 + 12 * unit(rng), -30 + 35 * unit(rng), -5 + 25 * unit(rng)});
    }
    const CoefficientSet set = custom_coefficients(table);
    const int steps = trial % 3 == 0 ? 20 : trial % 3 == 1 ? 5 + trial % 16 : steps_of(rng);
    if (!check_schedule(set, steps).ok) continue;
    ++accepted;
    for (int i = 0; i < 20000; ++i) {
      const double sigma = i % 2 == 0 ? std::pow(10.0, -6.0 * unit(rng)) : unit(rng);
      if (sigma < 1e-6) continue;
      const double y = composed(set, steps, sigma);
      ASSERT_TRUE(std::isfinite(y) && y > 0)
          << "trial " << trial << ": sigma " << sigma << " -> " << y << " at " << steps << " steps";
    }
  }
  EXPECT_GE(accepted, 3);  // accepted ones exist, so the property is exercised
  std::printf("  %d of 300 random schedules accepted\n", accepted);
}

TEST(NsSchedules, TheReportedSchedulesAreRefused) {
  const auto error_of = [](const CoefficientSet& set, int steps) {
    NsOptions o;
    o.coefficients = set;
    o.steps = steps;
    try {
      o.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  // aol is a 4-step design that cycles: at 5 steps its first tuple shrinks the result again.
  const std::string aol = error_of(coefficient_set("aol"), 5);
  EXPECT_NE(aol.find("'aol' at 5 steps"), std::string::npos) << aol;
  EXPECT_NE(aol.find("outside its band [0.9, 1.15]"), std::string::npos) << aol;
  EXPECT_NE(aol.find("supports 4, 8, 12, 16, 20 steps"), std::string::npos) << aol;
  // flash-newton-schulz's first aol table reverses singular values near 1 from its first step.
  const std::string first = error_of(parse_custom_coefficients("4.0098,-7.0585,2.4635;"
                                                               "3.4585,-5.5479,2.5959;"
                                                               "2.7573,-3.2939,1.4254;"
                                                               "2.7215,-3.0494,1.3169"),
                                     5);
  EXPECT_NE(first.find("at step 1"), std::string::npos) << first;
  EXPECT_NE(first.find("supports no step count"), std::string::npos) << first;
  // quintic at 6 steps cycles back to its first tuple: shrunk about 10x.
  const std::string q6 = error_of(coefficient_set("quintic"), 6);
  EXPECT_NE(q6.find("outside its band [0.9, 1.15]"), std::string::npos) << q6;
  EXPECT_NE(q6.find("supports 4-5, 9-10, 14-15, 19-20 steps"), std::string::npos) << q6;
  EXPECT_NE(error_of(coefficient_set("quintic"), 7).find("outside its band"), std::string::npos);
  EXPECT_EQ(error_of(coefficient_set("quintic"), 5), "(accepted)");
  // Divergent custom coefficients within the magnitude bound.
  const std::string div = error_of(parse_custom_coefficients("100,100,100"), 5);
  EXPECT_NE(div.find("'custom' at 5 steps"), std::string::npos) << div;
  EXPECT_NE(div.find("supports no step count"), std::string::npos) << div;
  // The band of each set at its documented step counts (docs/optimizer.md).
  const ScheduleCheck q = check_schedule(coefficient_set("quintic"), 5);
  EXPECT_TRUE(q.ok);
  EXPECT_NEAR(q.final_lo, 0.978, 0.005);
  EXPECT_NEAR(q.final_hi, 1.032, 0.005);
}

// warn_outside_band (distmuon.torch.Muon's schedule_check "warn"): a schedule that only ends
// outside its band runs; one that reverses, diverges or blows up a direction is still refused.
TEST(NsSchedules, WarnOutsideBandRefusesOnlyReversalsAndBlowUps) {
  const auto error_of = [](CoefficientSet set, int steps) {
    set.warn_outside_band = true;
    NsOptions o;
    o.coefficients = set;
    o.steps = steps;
    try {
      o.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(error_of(coefficient_set("quintic"), 6), "(accepted)");  // shrunk ~10x: warned
  EXPECT_EQ(error_of(parse_custom_coefficients("3.4445,-4.7750,2.0315"), 1), "(accepted)");
  EXPECT_EQ(error_of(parse_custom_coefficients("1.5,-0.5,0"), 5), "(accepted)");  // cubic
  EXPECT_EQ(error_of(coefficient_set("aol"), 5), "(accepted)");  // outside its band: warned
  EXPECT_NE(
      error_of(parse_custom_coefficients("4.0098,-7.0585,2.4635"), 5).find("reversed or cancelled"),
      std::string::npos);
  EXPECT_NE(error_of(parse_custom_coefficients("100,100,100"), 5).find("diverges"),
            std::string::npos);
  const std::string up = error_of(parse_custom_coefficients("3,0,0"), 5);  // 1 -> 243
  EXPECT_NE(up.find("a blown-up direction"), std::string::npos) << up;
  EXPECT_FALSE(check_schedule(coefficient_set("quintic"), 6).refused);
  EXPECT_TRUE(check_schedule(parse_custom_coefficients("3,0,0"), 5).refused);
}

}  // namespace
}  // namespace distmuon
