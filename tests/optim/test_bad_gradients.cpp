// Gradients with a NaN or an infinity (docs/reliability.md): Muon::step refuses them on every
// rank with the parameter named, and nothing is updated (weights, momentum, AdamW moments and
// the step count), so the next good step gives exactly what it would have given without the bad
// one.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "test_util.h"
#include "two_weight_model.h"

namespace distmuon {
namespace {

using Model = test::TwoWeightModel;

struct Grads {
  Matrix hidden, embed;
  explicit Grads(const Communicator& w, std::uint64_t seed)
      : hidden(test::random_matrix(16 / w.size(), 8, seed + static_cast<std::uint64_t>(w.rank()))),
        embed(test::random_matrix(6, 4, seed + 100)) {}
};

bool same(const Matrix& a, const Matrix& b) {
  for (Index i = 0; i < a.rows(); ++i)
    for (Index j = 0; j < a.cols(); ++j)
      if (a(i, j) != b(i, j)) return false;
  return true;
}

// Step 1 good, step 2 with `bad` at (row, col) of the named parameter on the last rank, then the
// good step 2: equal, bit for bit, to a model that never saw the bad gradient (the same code on
// the same data, so no tolerance).
void expect_refused(const std::string& param, float bad, const std::string& needle = "non-finite") {
  const Communicator& w = test::world();
  Model m(w), ref(w);
  const Grads g1(w, 1), g2(w, 2);
  m.step(g1.hidden, g1.embed);
  ref.step(g1.hidden, g1.embed);
  const Matrix hidden_before = m.hidden, embed_before = m.embed;

  Grads poisoned = g2;
  Matrix& target = param == "embed" ? poisoned.embed : poisoned.hidden;
  if (w.rank() == w.size() - 1) target(1, 2) = bad;
  try {
    m.step(poisoned.hidden, poisoned.embed);
    ADD_FAILURE() << "a gradient " << bad << " of " << param << " was accepted";
  } catch (const CollectiveError& e) {  // on every rank, the same message
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + param + "'"), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_NE(what.find("(1, 2)"), std::string::npos) << what;
  }
  EXPECT_EQ(m.opt.step_count(), 1);
  EXPECT_TRUE(same(m.hidden, hidden_before));
  EXPECT_TRUE(same(m.embed, embed_before));

  m.step(g2.hidden, g2.embed);
  ref.step(g2.hidden, g2.embed);
  EXPECT_EQ(m.opt.step_count(), 2);
  EXPECT_TRUE(same(m.hidden, ref.hidden)) << "the refused step changed the Muon state";
  EXPECT_TRUE(same(m.embed, ref.embed)) << "the refused step changed the AdamW state";
}

TEST(BadGradients, NanInAMuonWeightIsRefused) {
  expect_refused("hidden.w", std::numeric_limits<float>::quiet_NaN());
}

TEST(BadGradients, InfinityInAMuonWeightIsRefused) {
  expect_refused("hidden.w", std::numeric_limits<float>::infinity());
}

TEST(BadGradients, NanInAnAdamWWeightIsRefused) {
  expect_refused("embed", std::numeric_limits<float>::quiet_NaN());
}

TEST(BadGradients, NegativeInfinityInAnAdamWWeightIsRefused) {
  expect_refused("embed", -std::numeric_limits<float>::infinity());
}

// A finite gradient whose square is past float32's range: AdamW's second moment would be
// infinite (0.05 x 1e20^2 = 5e38 > 3.4e38). Refused on every rank naming the parameter, nothing
// written (the next good step equals a model that never saw it).
TEST(BadGradients, AGradientThatOverflowsAdamWsSecondMomentIsRefused) {
  expect_refused("embed", 1e20f, "would overflow");
  expect_refused("embed", -9e19f, "past float32's range");  // 4.05e38
}

// Just under the range, each element alone: two elements of 7e19 pass the norm bound's first look
// (0.05 x 9.8e39 > 3.4e38) but not the element check (0.05 x 4.9e39 = 2.45e38 each): the step
// runs, and every state stays finite.
TEST(BadGradients, LargeFiniteGradientsWithinTheRangeAreStepped) {
  const Communicator& w = test::world();
  Model m(w);
  Grads g(w, 1);
  g.embed(0, 0) = 7e19f;
  g.embed(1, 2) = -7e19f;
  m.step(g.hidden, g.embed);
  EXPECT_EQ(m.opt.step_count(), 1);
  const std::vector<MatrixView> state = m.opt.state_tensors(1);  // exp_avg, exp_avg_sq
  ASSERT_EQ(state.size(), 2u);
  for (const MatrixView s : state)
    for (Index i = 0; i < s.rows; ++i)
      for (Index j = 0; j < s.cols; ++j)
        EXPECT_TRUE(std::isfinite(s(i, j))) << i << "," << j;
  EXPECT_GT(state[1](0, 0), 2e38f);
  for (const float v : m.embed.values())
    EXPECT_TRUE(std::isfinite(v));
}

// Finite settings and weights whose step would leave float32's range (a learning rate of 3e38, a
// weight near the largest float on the last rank): refused on every rank naming the parameter,
// before anything is written, and every value stays finite. The bound (weight_range.cpp) is
// |f| ||w||_F + lr ||u||_F for Muon and |f| ||p||_F + lr |m'| / ((1 - beta1^t) eps) for AdamW.
void expect_range_refused(MuonOptions o, const std::string& param, float weight) {
  const Communicator& w = test::world();
  o.tp_mode = TpMode::kDuplicated;
  Model m(w, o);
  if (w.rank() == w.size() - 1) (param == "embed" ? m.embed : m.hidden)(0, 0) = weight;
  const Matrix hidden_before = m.hidden, embed_before = m.embed;
  const Grads g(w, 1);
  try {
    m.step(g.hidden, g.embed);
    ADD_FAILURE() << "a step past float32's range was taken";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + param + "' could take its weights past float32's range"),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(m.opt.step_count(), 0);
  EXPECT_TRUE(same(m.hidden, hidden_before));
  EXPECT_TRUE(same(m.embed, embed_before));
  for (const MatrixView s : m.opt.state_tensors(0))
    for (Index i = 0; i < s.rows; ++i)
      for (Index j = 0; j < s.cols; ++j)
        EXPECT_EQ(s(i, j), 0.0f);  // the momentum untouched
}

TEST(BadGradients, StepsPastFloat32sRangeAreRefused) {
  expect_range_refused({.lr = 3e38}, "hidden.w", 0.5f);
  expect_range_refused({}, "hidden.w", std::numeric_limits<float>::max());
  MuonOptions adamw;
  adamw.adamw.lr = 3e38;
  expect_range_refused(adamw, "embed", 0.5f);
  expect_range_refused({}, "embed", -std::numeric_limits<float>::max());
}

// A caller's own check failing on the last rank (Muon::step(grads, failure), what the Python
// bindings pass): every rank throws with its text before any update, the failing rank passing
// no gradients at all; the next good step runs on every rank.
TEST(BadGradients, CallerFailureOnOneRankIsAgreed) {
  const Communicator& w = test::world();
  Model m(w);
  const Grads g(w, 1);
  const Matrix hidden_before = m.hidden, embed_before = m.embed;
  const bool failing = w.rank() == w.size() - 1;
  const ConstMatrixView grads[] = {g.hidden.view(), g.embed.view()};
  try {
    if (failing) {
      m.opt.step({}, "gradient 1: not an array");
    } else {
      m.opt.step(grads, "");
    }
    ADD_FAILURE() << "a caller's failure was ignored";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("rank(s) {} of {}", w.size() - 1, w.size())), std::string::npos)
        << what;
    EXPECT_NE(what.find("gradient 1: not an array"), std::string::npos) << what;
  }
  EXPECT_EQ(m.opt.step_count(), 0);
  EXPECT_TRUE(same(m.hidden, hidden_before));
  EXPECT_TRUE(same(m.embed, embed_before));
  m.opt.step(grads, "");
  EXPECT_EQ(m.opt.step_count(), 1);
  EXPECT_FALSE(same(m.hidden, hidden_before));
}

// A weight or an optimizer state that is not finite when a step starts (a NaN written by the
// caller, a bad state loaded): refused on every rank before any update, naming it; every other
// weight keeps its last good value (no weight is written with a non-finite update), the step
// count is unchanged, and the step succeeds once the value is repaired.
void expect_state_refused(const std::string& needle, bool in_momentum) {
  const Communicator& w = test::world();
  Model m(w);
  const Grads g1(w, 1), g2(w, 2);
  m.step(g1.hidden, g1.embed);
  const Matrix hidden_before = m.hidden, embed_before = m.embed;
  const bool last = w.rank() == w.size() - 1;
  MatrixView target = in_momentum ? m.opt.state_tensors(0)[0] : m.hidden.view();
  const float good = target(1, 2);
  if (last) target(1, 2) = std::numeric_limits<float>::quiet_NaN();
  try {
    m.step(g2.hidden, g2.embed);
    ADD_FAILURE() << "a non-finite " << needle << " was stepped";
  } catch (const CollectiveError& e) {  // on every rank
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_NE(what.find("(1, 2)"), std::string::npos) << what;
    EXPECT_NE(what.find("before the step"), std::string::npos) << what;
  }
  EXPECT_EQ(m.opt.step_count(), 1);
  EXPECT_TRUE(same(m.embed, embed_before));
  for (Index i = 0; i < m.hidden.rows(); ++i) {
    for (Index j = 0; j < m.hidden.cols(); ++j) {
      if (last && !in_momentum && i == 1 && j == 2) continue;  // the NaN the caller wrote
      EXPECT_EQ(m.hidden(i, j), hidden_before(i, j)) << i << "," << j;
    }
  }
  if (last) target(1, 2) = good;
  m.step(g2.hidden, g2.embed);
  EXPECT_EQ(m.opt.step_count(), 2);
  for (const float v : m.hidden.values())
    EXPECT_TRUE(std::isfinite(v));
}

TEST(BadGradients, NonFiniteWeightIsRefusedBeforeAnyUpdate) {
  expect_state_refused("weight 'hidden.w'", false);
}

TEST(BadGradients, NonFiniteMomentumIsRefusedBeforeAnyUpdate) {
  expect_state_refused("momentum state of 'hidden.w'", true);
}

// A coefficient schedule that diverges (or reverses the update) is refused when the options are
// set, so no step can write its non-finite result into a weight.
TEST(BadGradients, DivergentScheduleIsRefusedByTheOptions) {
  MuonOptions o;
  o.coefficients = "custom";
  o.custom_coefficients = "100,100,100";
  EXPECT_THROW(Muon(o, test::world(), cpu_compute()), Error);
  o.coefficients = "aol";
  EXPECT_THROW(o.validate(), Error);
  o.coefficients = "quintic";
  o.steps = 6;
  EXPECT_THROW(o.validate(), Error);
}

}  // namespace
}  // namespace distmuon
