// Gram Newton-Schulz (NsAlgorithm::kGram) against the standard iteration with the same
// coefficients, on random and ill-conditioned inputs, with and without restarts; the distributed
// Gram NS over a group of two ranks against the single-process one, with its all-reduce count;
// its FLOP count against a count written out by hand; and the options it rejects.
//
// Gram NS runs the same polynomial in another order (s x s products of G_0 = X_0 X_0^T, then
// X = Q X_0), so in exact arithmetic it equals standard NS; in fp32 the two differ by rounding,
// which the polynomials amplify. The tolerances below were measured on this implementation and
// are stated next to each comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::random_matrix;

struct Shape {
  Index m, n;
  const char* label;
};
const Shape kShapes[] = {{48, 112, "wide"}, {112, 48, "tall"}, {64, 64, "square"}};

// The step count each built-in set is meant for.
int steps_for(const std::string& set) {
  if (set == "polar_express") return 8;
  if (set == "deepseekv4") return 10;
  if (set == "aol") return 4;
  return 5;
}

NsOptions options(const std::string& set, NsAlgorithm algorithm, int restart = 0) {
  NsOptions o;
  o.coefficients = coefficient_set(set);
  o.steps = steps_for(set);
  o.algorithm = algorithm;
  o.gram_restart = restart;
  return o;
}

// The built-in sets NS accepts at their step count (every one).
std::vector<std::string> builtin_sets() {
  std::vector<std::string> out;
  for (const std::string& name : coefficient_set_names())
    if (name != "custom" && check_schedule(coefficient_set(name), steps_for(name)).ok)
      out.push_back(name);
  return out;
}

// k orthonormal columns (rows x k) from Gaussian vectors by modified Gram-Schmidt applied twice,
// in double (orthogonal to ~1e-15).
std::vector<double> orthonormal_columns(Index rows, Index k, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> q(static_cast<std::size_t>(rows * k));
  auto at = [&](Index i, Index j) -> double& { return q[static_cast<std::size_t>(i * k + j)]; };
  for (double& v : q)
    v = normal(rng);
  for (Index j = 0; j < k; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (Index p = 0; p < j; ++p) {
        double dot = 0;
        for (Index i = 0; i < rows; ++i)
          dot += at(i, p) * at(i, j);
        for (Index i = 0; i < rows; ++i)
          at(i, j) -= dot * at(i, p);
      }
    }
    double norm = 0;
    for (Index i = 0; i < rows; ++i)
      norm += at(i, j) * at(i, j);
    norm = std::sqrt(norm);
    for (Index i = 0; i < rows; ++i)
      at(i, j) /= norm;
  }
  return q;
}

// X = U diag(sigma) V^T with random orthonormal U (m x s), V (n x s), s = min(m, n), and sigma
// log-spaced from 1 down to 1e-6 (condition number 1e6).
Matrix ill_conditioned(Index m, Index n, std::uint64_t seed) {
  const Index s = std::min(m, n);
  const std::vector<double> u = orthonormal_columns(m, s, seed);
  const std::vector<double> v = orthonormal_columns(n, s, seed + 1);
  std::vector<double> sigma(static_cast<std::size_t>(s));
  for (Index k = 0; k < s; ++k)
    sigma[static_cast<std::size_t>(k)] = std::pow(10.0, -6.0 * static_cast<double>(k) / (s - 1));
  Matrix x(m, n);
  for (Index i = 0; i < m; ++i) {
    for (Index j = 0; j < n; ++j) {
      double acc = 0;
      for (Index k = 0; k < s; ++k)
        acc += u[static_cast<std::size_t>(i * s + k)] * sigma[static_cast<std::size_t>(k)] *
               v[static_cast<std::size_t>(j * s + k)];
      x(i, j) = static_cast<float>(acc);
    }
  }
  return x;
}

// The worst relative Frobenius error of Gram NS against standard NS over the three shapes, for
// one coefficient set and inputs made by `input`; prints each measurement.
template <typename Input>
double worst_gram_error(const std::string& set, const char* conditioning, int restart,
                        Input input) {
  double worst = 0;
  for (const Shape& sh : kShapes) {
    const Matrix g = input(sh.m, sh.n);
    const Matrix standard =
        newton_schulz(g.view(), options(set, NsAlgorithm::kStandard), cpu_compute());
    const Matrix gram =
        newton_schulz(g.view(), options(set, NsAlgorithm::kGram, restart), cpu_compute());
    const double err = relative_error(gram.view(), standard.view());
    std::printf("  gram vs standard  %-14s %-6s %-5s restart=%d  rel.err %.3e\n", set.c_str(),
                sh.label, conditioning, restart, err);
    worst = std::max(worst, std::isfinite(err) ? err : std::numeric_limits<double>::infinity());
  }
  return worst;
}

Matrix gaussian(Index m, Index n) {
  return random_matrix(m, n, 17);
}
Matrix ill(Index m, Index n) {
  return ill_conditioned(m, n, 29);
}

// Bounds per set with automatic restarts (gram_restart 0: quintic, simple and cubic5 at 5
// steps restart never; polar_express at 8 steps, cans at 5 and deepseekv4 at 10 once), about 3x
// the worst relative error measured over the three shapes (48x112, 112x48, 64x64; Gaussian seed
// 17, ill-conditioned seed 29). Measured without any restart:
//   set            Gaussian worst -> bound     ill-conditioned worst -> bound
//   simple         2.1e-5 -> 6e-5              3.1e-4 -> 1e-3
//   quintic        2.4e-5 -> 7e-5              2.9e-4 -> 1e-3
//   polar_express  6.7e-4 -> 2e-3              3.8e-2 -> 1e-1
//   cans           4.5e-4 -> 1.5e-3            3.2e-3 -> 1e-2
//   deepseekv4     5.3e-4 -> 1.5e-3            diverges (1e12..1e16), see below
//   cubic5         3.2e-6 -> 1e-5              2.1e-5 -> 6e-5
//   aol (4 steps)  2.0e-5 -> 6e-5              7.9e-5 -> 2.5e-4
// The worst Gaussian case is always the square matrix, whose smallest singular values are near
// 0. G_0 holds sigma^2: below fp32 resolution for sigma < ~3e-4, so rounding leaves R with small
// eigenvalues of either sign; a step maps lambda to lambda p(lambda)^2 ~ a^2 lambda, and a
// negative one is not pulled back to 1 as a positive one is. The polynomial schedules with the
// largest first coefficients (polar_express, cans) amplify that rounding the most.
struct Bounds {
  const char* set;
  double gaussian, ill;  // ill < 0: not bounded without restarts
};
const Bounds kBounds[] = {
    {"simple", 6e-5, 1e-3}, {"quintic", 7e-5, 1e-3},      {"polar_express", 2e-3, 2e-3},
    {"cans", 1.5e-3, 3e-3}, {"deepseekv4", 1.5e-3, 4e-3}, {"cubic5", 1e-5, 6e-5},
    {"aol", 6e-5, 2.5e-4},
};

TEST(GramNewtonSchulz, EveryBuiltInSetHasABound) {
  std::vector<std::string> bounded;
  for (const Bounds& b : kBounds)
    bounded.push_back(b.set);
  std::sort(bounded.begin(), bounded.end());
  EXPECT_EQ(bounded, builtin_sets());  // a new set needs its measured bound here
}

TEST(GramNewtonSchulz, MatchesStandardOnGaussianInputs) {
  for (const Bounds& b : kBounds)
    EXPECT_LE(worst_gram_error(b.set, "gauss", 0, gaussian), b.gaussian) << b.set;
}

// Singular values log-spaced over 1 .. 1e-6 (condition number 1e6).
TEST(GramNewtonSchulz, MatchesStandardOnIllConditionedInputs) {
  for (const Bounds& b : kBounds) {
    if (b.ill > 0) EXPECT_LE(worst_gram_error(b.set, "ill", 0, ill), b.ill) << b.set;
  }
}

// deepseekv4 runs 10 steps with a = 3.4445 on the first 8: without a restart a negative rounding
// eigenvalue of R (~ -1e-8) grows by a^2 ~ 11.9 per step to order 1, where the polynomial
// diverges (measured relative error 1e12 .. 1e16 against standard NS). The automatic restart
// (after step 4, where the growth would pass kGramGrowthLimit) keeps it bounded.
TEST(GramNewtonSchulz, AutomaticRestartsKeepLongSchedulesBounded) {
  const int never = steps_for("deepseekv4");  // a period of `steps`: no restart is reached
  EXPECT_GT(worst_gram_error("deepseekv4", "ill", never, ill), 1.0);  // diverges
  EXPECT_LE(worst_gram_error("deepseekv4", "ill", 0, ill), 4e-3);
  // The restart plan: none for quintic at 5 steps (growth 3.0e4 < 5e4); polar_express after step
  // 3 (1.8e5); deepseekv4 after step 4 (2.3e5).
  NsOptions q = options("quintic", NsAlgorithm::kGram);
  EXPECT_EQ(gram_ns_gram_count(q), 1);
  NsOptions p = options("polar_express", NsAlgorithm::kGram);
  for (int step = 0; step < p.steps; ++step)
    EXPECT_EQ(gram_restarts_after(p, step), step == 3) << step;
  NsOptions d = options("deepseekv4", NsAlgorithm::kGram);
  for (int step = 0; step < d.steps; ++step)
    EXPECT_EQ(gram_restarts_after(d, step), step == 4) << step;
  EXPECT_EQ(gram_ns_gram_count(d), 2);
}

// Restarts re-form R from X = Q X_0, so rounding in R cannot compound past gram_restart steps.
// gram_restart = 1 does that after every step: X = P X and R = X X^T are standard NS's products
// in the same order, bit for bit (measured 0 for every set, shape and input). For 2 and 3 the
// worst measured over every set and shape is 1.3e-5 (Gaussian, cans) and 6.8e-4 (ill-conditioned,
// deepseekv4): bounds 4e-5 and 2e-3.
TEST(GramNewtonSchulz, RestartsMatchStandard) {
  for (const std::string& set : builtin_sets()) {
    EXPECT_EQ(worst_gram_error(set, "gauss", 1, gaussian), 0.0) << set;
    EXPECT_EQ(worst_gram_error(set, "ill", 1, ill), 0.0) << set;
    for (int restart : {2, 3}) {
      EXPECT_LE(worst_gram_error(set, "gauss", restart, gaussian), 4e-5) << set << " " << restart;
      EXPECT_LE(worst_gram_error(set, "ill", restart, ill), 2e-3) << set << " " << restart;
    }
  }
}

// The restart period only changes where rounding happens: gram_restart >= steps (no restart
// reached) is bit-equal to quintic's automatic plan at 5 steps (no restart either).
TEST(GramNewtonSchulz, RestartPastTheLastStepIsNoRestart) {
  const Matrix g = random_matrix(40, 72, 3);
  const Matrix none =
      newton_schulz(g.view(), options("quintic", NsAlgorithm::kGram, 0), cpu_compute());
  const Matrix late =
      newton_schulz(g.view(), options("quintic", NsAlgorithm::kGram, 5), cpu_compute());
  const Matrix every =
      newton_schulz(g.view(), options("quintic", NsAlgorithm::kGram, 1), cpu_compute());
  EXPECT_EQ(relative_error(late.view(), none.view()), 0.0);
  EXPECT_GT(relative_error(every.view(), none.view()), 0.0);  // a different order of products
}

// The distributed Gram NS over a group of two: rows split (Gram on the columns, kCols) and
// columns split (Gram on the rows, kRows) against the single-process Gram NS of the full matrix
// with the same side. The group sums two partial Gram matrices where one process forms one
// product: a rounding difference in G_0 that the iteration amplifies as above. Measured worst
// over both splits (96x40 and 40x96, Gaussian): quintic 4.0e-6 (restart 2: 9.3e-7),
// polar_express 2.0e-4 (restart 2: 9.1e-6); bounds about 3x those.
struct DistributedBound {
  const char* set;
  int restart;
  double bound;
};
const DistributedBound kDistributed[] = {{"quintic", 0, 1.5e-5},
                                         {"quintic", 2, 3e-6},
                                         {"polar_express", 0, 6e-4},
                                         {"polar_express", 2, 3e-5}};

TEST(GramNewtonSchulz, DistributedMatchesSingleProcess) {
  const Communicator& w = test::world();
  if (w.size() < 2) GTEST_SKIP() << "needs a group of 2 ranks";
  const Communicator pair = w.split(w.rank() / 2, w.rank());
  ASSERT_EQ(pair.size(), 2);
  for (const auto& [set_name, restart, bound] : kDistributed) {
    const std::string set = set_name;
    for (const int dim : {0, 1}) {
      // dim 0: a tall matrix split by rows, Gram n x n; dim 1: a wide one split by columns.
      const Index m = dim == 0 ? 96 : 40, n = dim == 0 ? 40 : 96;
      const Matrix full = random_matrix(m, n, 71);
      NsOptions o = options(set, NsAlgorithm::kGram, restart);
      o.side = dim == 0 ? GramSide::kCols : GramSide::kRows;
      const auto [err, stats] = test::distributed_ns(full, dim, o, pair);
      std::printf("  distributed gram  %-14s dim=%d restart=%d  rel.err %.3e\n", set.c_str(), dim,
                  restart, err);
      EXPECT_LE(err, bound) << set << " dim " << dim << " restart " << restart;
      // One norm all-reduce plus 1 + restarts Gram all-reduces, not one per step.
      const int grams = gram_ns_gram_count(o);
      // Automatic (0): quintic at 5 steps never restarts, polar_express at 8 once.
      const int automatic = set == "polar_express" ? 2 : 1;
      EXPECT_EQ(grams, restart > 0 ? 1 + (o.steps - 1) / restart : automatic);
      EXPECT_LT(grams, o.steps);
      EXPECT_EQ(stats.all_reduce.calls, static_cast<std::size_t>(1 + grams));
      const auto s = static_cast<std::size_t>(dim == 0 ? n : m);
      EXPECT_EQ(stats.all_reduce.bytes, 8 + static_cast<std::size_t>(grams) * s * s * 4);
      EXPECT_EQ(stats.all_gather.calls, 0u);
      // The traffic model says the same.
      const TpTraffic t = tp_traffic(m, n, 2, dim, TpMode::kDistributed, o);
      EXPECT_EQ(t.all_reduce_calls, stats.all_reduce.calls);
      EXPECT_EQ(t.all_reduce_bytes, stats.all_reduce.bytes);
    }
  }
}

// The standard algorithm over the same group all-reduces once per step: the count above is the
// Gram algorithm's saving, not a property of the group.
TEST(GramNewtonSchulz, StandardDistributedReducesEveryStep) {
  const Communicator& w = test::world();
  if (w.size() < 2) GTEST_SKIP() << "needs a group of 2 ranks";
  const Communicator pair = w.split(w.rank() / 2, w.rank());
  auto stats = std::make_shared<CommStats>();
  const Communicator counted = counting_communicator(pair, stats);
  NsOptions o = options("quintic", NsAlgorithm::kStandard);
  o.side = GramSide::kCols;
  Matrix mine = shard_of(random_matrix(96, 40, 71).view(), 0, 2, pair.rank());
  newton_schulz_inplace(mine.view(), o, cpu_compute(), &counted);
  EXPECT_EQ(stats->all_reduce.calls, static_cast<std::size_t>(1 + o.steps));
}

// ns_flops for the Gram algorithm, counted by hand from the iteration
// (syrk: s^2 L for the Gram matrix, s^3 for a symmetric square; gemm: twice those; a general
// product 2 s^3 or 2 s^2 L).
TEST(GramNewtonSchulz, FlopCountByHand) {
  // 4 x 8 (s = 4, L = 8), quintic (c != 0), 2 steps, syrk, no restart:
  //   G_0 = 128; step 0: R^2 64, Q = P (free), P^2 64, R P^2 128; step 1: R^2 64, P Q 128;
  //   X = Q X_0: 256. Total 832.
  NsOptions a = options("quintic", NsAlgorithm::kGram);
  a.steps = 2;
  EXPECT_DOUBLE_EQ(ns_flops(4, 8, a), 832.0);
  // 8 x 4 (tall: s = 4, L = 8), cubic5 (c = 0: no R^2), 5 steps, gemm (symmetric = 2x), restart
  // every 2 steps (after steps 1 and 3, 0-based):
  //   G_0 256; s0: Q = P, P^2 128, R P^2 128; s1: P Q 128, restart: X = Q X_0 256 + R 256;
  //   s2: Q = P, 256 (P^2, R P^2); s3: P Q 128, restart 512; s4: Q = P; X = Q X_0 256.
  //   Total 256 + 256 + 128 + 512 + 256 + 128 + 512 + 256 = 2304.
  NsOptions b = options("cubic5", NsAlgorithm::kGram, 2);
  b.use_syrk = false;
  EXPECT_DOUBLE_EQ(ns_flops(8, 4, b), 2304.0);
  EXPECT_EQ(gram_ns_gram_count(b), 3);
  NsOptions automatic = options("quintic", NsAlgorithm::kGram);
  EXPECT_EQ(gram_ns_gram_count(automatic), 1);
  // The standard algorithm's count through the same entry point is the legacy one.
  NsOptions c = options("quintic", NsAlgorithm::kStandard);
  EXPECT_DOUBLE_EQ(ns_flops(4, 8, c), ns_flops(4, 8, c.steps, c.use_syrk, c.side, &c.coefficients));
}

TEST(GramNewtonSchulz, OptionsRejectAutoAndNegativeRestart) {
  NsOptions o;
  o.algorithm = NsAlgorithm::kAuto;
  EXPECT_THROW(o.validate(), Error);
  o.algorithm = NsAlgorithm::kGram;
  o.gram_restart = -1;
  EXPECT_THROW(o.validate(), Error);
  o.gram_restart = 0;
  EXPECT_NO_THROW(o.validate());
  Matrix x = random_matrix(4, 6, 1);
  o.algorithm = NsAlgorithm::kAuto;
  EXPECT_THROW(newton_schulz_inplace(x.view(), o, cpu_compute()), Error);
}

}  // namespace
}  // namespace distmuon
