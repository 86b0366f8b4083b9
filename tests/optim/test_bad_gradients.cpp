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

namespace distmuon {
namespace {

// This rank's shards: a 16 x 8 Muon weight "hidden.w" with its rows over the world, and a full
// 6 x 4 AdamW weight "embed" on every rank.
struct Model {
  Matrix hidden, embed;
  Muon opt;
  explicit Model(const Communicator& w)
      : hidden(test::random_matrix(16 / w.size(), 8, 10 + static_cast<std::uint64_t>(w.rank()))),
        embed(test::random_matrix(6, 4, 20)),
        opt(MuonOptions{.tp_mode = TpMode::kDuplicated}, w, cpu_compute()) {
    opt.add_parameter({.name = "hidden.w",
                       .local = hidden.view(),
                       .rows = 16,
                       .cols = 8,
                       .gtp_sharded = w.size() > 1,
                       .gtp_group = w});
    opt.add_parameter({.name = "embed",
                       .local = embed.view(),
                       .rows = 6,
                       .cols = 4,
                       .role = ParamRole::kEmbedding});
  }
  void step(const Matrix& gh, const Matrix& ge) {
    const ConstMatrixView grads[] = {gh.view(), ge.view()};
    opt.step(grads);
  }
};

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
void expect_refused(const std::string& param, float bad) {
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
    ADD_FAILURE() << "a non-finite gradient of " << param << " was accepted";
  } catch (const CollectiveError& e) {  // on every rank, the same message
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + param + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("non-finite"), std::string::npos) << what;
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

}  // namespace
}  // namespace distmuon
