// A non-finite Newton-Schulz input in a weight sharded over a subgroup (docs/reliability.md,
// "Failures and their scope"): on the CPU backend too, NS over the weight's groups does not throw
// (it leaves the update NaN), and Muon::step agrees the failure once over the world at the end of
// its compute phase: every rank, inside the weight's groups or not, raises the same
// CollectiveError naming the weight, scoped to the world, and nothing is updated. Before, the
// ranks of that weight's groups threw alone and the others went on into the next weight's
// collectives and waited there forever (the test's TIMEOUT catches that).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "distmuon/tp.h"
#include "test_util.h"

namespace distmuon {
namespace {

constexpr float kHuge = 3e38f;  // finite; w + g overflows the L2 momentum step (g' = g + w)

// TP x GTP = 2 x (world / 2). This rank's shards, in registration order:
//   own.w    8 x 8, whole on every rank (NS on this rank alone)
//   tp.w     8 x 16, columns over the TP group (2 ranks)
//   gtp.w    (4 ranks) 16 x 8, rows over the GTP group (2 ranks)
//   world.w  8W x 8, rows over the world (last: every rank's final collectives)
//   embed    4 x 4 AdamW, whole on every rank
struct Model {
  ProcessGroups groups;
  std::vector<std::string> names;
  std::vector<Matrix> w;
  Muon opt;
  Model(const Communicator& world, TpMode mode)
      : groups(make_process_groups(world, 2, world.size() / 2)),
        opt(MuonOptions{.weight_decay = 1.0,
                        .weight_decay_method = WeightDecayMethod::kL2,
                        .tp_mode = mode},
            world, cpu_compute()) {
    const int W = world.size();
    auto add = [&](ParamSpec spec, Index rows, Index cols) {
      names.push_back(spec.name);
      w.push_back(test::random_matrix(rows, cols, 7 * names.size() + world.rank()));
      spec.local = w.back().view();
      opt.add_parameter(spec);
    };
    add({.name = "own.w", .rows = 8, .cols = 8}, 8, 8);
    add({.name = "tp.w", .rows = 8, .cols = 16, .tp_partition_dim = 1, .tp_group = groups.tp}, 8,
        8);
    if (W == 4) {
      add({.name = "gtp.w", .rows = 16, .cols = 8, .gtp_sharded = true, .gtp_group = groups.gtp}, 8,
          8);
    }
    add({.name = "world.w", .rows = 8 * W, .cols = 8, .gtp_sharded = true, .gtp_group = world}, 8,
        8);
    add({.name = "embed", .rows = 4, .cols = 4, .role = ParamRole::kEmbedding}, 4, 4);
  }
  std::size_t index(const std::string& name) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return i;
    throw Error("no parameter " + name);
  }
  // Every weight and optimizer state of this rank, copied.
  std::vector<Matrix> state() {
    std::vector<Matrix> out = w;
    for (std::size_t i = 0; i < w.size(); ++i)
      for (const MatrixView v : opt.state_tensors(i))
        out.push_back(Matrix::from(v));
    return out;
  }
};

std::vector<Matrix> gradients(const Model& m, std::uint64_t seed, int rank) {
  std::vector<Matrix> g;
  for (const Matrix& w : m.w)
    g.push_back(test::random_matrix(w.rows(), w.cols(), seed + 100 * g.size() + rank));
  return g;
}

void step(Model& m, const std::vector<Matrix>& g) {
  std::vector<ConstMatrixView> views;
  for (const Matrix& x : g)
    views.push_back(x.view());
  m.opt.step(views);
}

bool same(const std::vector<Matrix>& a, const std::vector<Matrix>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k) {
    const auto va = a[k].values(), vb = b[k].values();
    if (!std::equal(va.begin(), va.end(), vb.begin(), vb.end())) return false;
  }
  return true;
}

// Step 1 good; step 2 with an overflowing momentum step at (0, 0) of `weight` on world rank
// `bad_rank` only: the same CollectiveError on every rank, scoped to the world, naming the
// weight; nothing changed. Then the good step 2: bit for bit what a model that never saw the bad
// one gives (the same code on the same data, so no tolerance).
void expect_agreed_over_the_world(const std::string& weight, int bad_rank) {
  const Communicator& world = test::world();
  for (const TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kOwner}) {
    SCOPED_TRACE(fmt::format("{} on rank {}, tp_mode {}", weight, bad_rank, to_string(mode)));
    Model m(world, mode), ref(world, mode);
    const auto g1 = gradients(m, 1, world.rank()), g2 = gradients(m, 2, world.rank());
    step(m, g1);
    step(ref, g1);
    const std::size_t i = m.index(weight);
    auto bad = g2;
    const float kept = m.w[i](0, 0);
    if (world.rank() == bad_rank) {
      m.w[i](0, 0) = kHuge;  // finite: the check before the step lets it through
      bad[i](0, 0) = kHuge;
    }
    const std::vector<Matrix> before = m.state();
    std::string message;
    try {
      step(m, bad);
      ADD_FAILURE() << "an overflowing NS input was stepped";
    } catch (const CollectiveError& e) {
      message = e.what();
      EXPECT_TRUE(e.scope().is_world()) << e.scope().describe();
      EXPECT_EQ(e.scope().size, world.size());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not agreed over the world: " << e.what();
    }
    EXPECT_NE(message.find("'" + weight + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("not finite"), std::string::npos) << message;
    EXPECT_EQ(world.broadcast_string(message, 0), message) << "ranks differ in the message";
    EXPECT_EQ(m.opt.step_count(), 1);
    EXPECT_TRUE(same(m.state(), before)) << "the refused step changed a weight or a state";

    if (world.rank() == bad_rank) m.w[i](0, 0) = kept;
    step(m, g2);
    step(ref, g2);
    EXPECT_EQ(m.opt.step_count(), 2);
    EXPECT_TRUE(same(m.state(), ref.state())) << "the refused step left a trace";
  }
}

TEST(ScopedFailures, OverflowInARankOwnWeightIsAgreedOverTheWorld) {
  expect_agreed_over_the_world("own.w", 0);
}

TEST(ScopedFailures, OverflowInATpShardedWeightIsAgreedOverTheWorld) {
  expect_agreed_over_the_world("tp.w", 0);
}

TEST(ScopedFailures, OverflowInAGtpShardedWeightIsAgreedOverTheWorld) {
  if (test::world().size() != 4) GTEST_SKIP() << "a GTP subgroup needs 4 ranks";
  expect_agreed_over_the_world("gtp.w", 3);
}

}  // namespace
}  // namespace distmuon
