// Separate 2-D weights of equal shape (a transformer's per-layer q/k/v/o or MLP matrices)
// orthogonalised as one batched Newton-Schulz per group of equal shape, on a backend that
// batches NS (Compute::batches_newton_schulz: the opaque backend here, which counts its product
// calls): duplicated mode (TP x GTP-sharded weights, gathered in order and held until their group
// runs), owner mode (each owner's weights of a pipelined chunk), replicated weights on homes and
// on every rank. Tolerance 0 against the cpu backend, which runs each weight's NS on its own
// (the batched products multiply each matrix as its own product does), and the number of NS
// runs per step on each rank equals the number of equal-shape groups it orthogonalises.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "distmuon/tp.h"
#include "optim_test_util.h"
#include "tp/owner_ns.h"

namespace distmuon {
namespace {

using test::TestLayout;

// Eight weights of three shapes, the equal shapes not adjacent: four attention-like 64 x 48
// (TP rows), three MLP-like 96 x 32 (TP columns), one 32 x 80. group[i]: weight i's shape.
struct Model {
  std::vector<TestLayout> layouts;
  std::vector<int> group;
  std::vector<Index> batch;  // ParamSpec::batch of each weight (empty: 1 each)
};

Model model_for(int T, int G) {
  const int rows = T > 1 ? 0 : kNoPartition, cols = T > 1 ? 1 : kNoPartition;
  const TestLayout a{.m = 64, .n = 48, .tp_dim = rows, .tp = T, .gtp = G};
  const TestLayout b{.m = 96, .n = 32, .tp_dim = cols, .tp = T, .gtp = G};
  const TestLayout c{.m = 32, .n = 80, .tp_dim = rows, .tp = T, .gtp = G};
  Model m;
  for (const int g : {0, 1, 0, 2, 0, 1, 0, 1}) {
    m.layouts.push_back(g == 0 ? a : g == 1 ? b : c);
    m.group.push_back(g);
  }
  return m;
}

struct Result {
  std::vector<Matrix> shards;  // after the steps
  std::vector<ParamInfo> info;
  std::size_t ns_runs = 0;  // NS runs of the last step on this rank
  std::size_t batched = 0;  // matrices its batched products multiplied, per product
};

// Two Muon steps of the model (fixed seeds per weight and step); dp: the weights' replica group.
// count: the NS runs counted (standard NS with syrk, whose every step makes 3 products).
Result run(const Model& model, const MuonOptions& o, const ProcessGroups& groups, Compute& compute,
           const std::optional<Communicator>& dp = std::nullopt, bool count = true) {
  const int t = groups.tp.rank(), g = groups.gtp.rank();
  // Weight i's shards (its batch's stacked by rows), from seeds of `seed`.
  auto shard = [&](std::size_t i, std::uint64_t seed) {
    const TestLayout& l = model.layouts[i];
    const Index batch = model.batch.empty() ? 1 : model.batch[i], r = l.shard_rows();
    Matrix all(batch * r, l.n_tp());
    for (Index k = 0; k < batch; ++k) {
      const Matrix s = test::shard_for(test::random_matrix(l.m, l.n, 16 * seed + k).view(), l,
                                       l.tp > 1 ? t : 0, l.gtp > 1 ? g : 0);
      std::memcpy(all.view().row_block(k * r, r).data, s.data(),
                  sizeof(float) * static_cast<std::size_t>(s.size()));
    }
    return all;
  };
  Muon muon(o, test::world(), compute);
  std::vector<DeviceMatrix> weights;
  for (std::size_t i = 0; i < model.layouts.size(); ++i) {
    weights.push_back(to_device(compute, shard(i, 1 + i).view()));
    ParamSpec s =
        test::layout_spec(model.layouts[i], groups, weights.back().view(), "w" + std::to_string(i));
    s.dp_group = dp;
    s.batch = model.batch.empty() ? 1 : model.batch[i];
    muon.add_parameter(s);
  }
  Result out;
  const int products_per_ns = 3 * o.steps;  // standard NS, syrk: A, A^2 and the update per step
  for (int step = 0; step < 2; ++step) {
    std::vector<DeviceMatrix> grads;
    std::vector<ConstMatrixView> views;
    for (std::size_t i = 0; i < model.layouts.size(); ++i) {
      grads.push_back(to_device(compute, shard(i, 1000 * (step + 1) + i).view()));
      views.push_back(grads.back().view());
    }
    const Compute::ProductCalls before = compute.product_calls();
    muon.step(views);
    const Compute::ProductCalls after = compute.product_calls();
    const std::size_t calls = (after.gemm - before.gemm) + (after.syrk - before.syrk) +
                              (after.batched_calls - before.batched_calls);
    if (!count) continue;
    EXPECT_EQ(calls % static_cast<std::size_t>(products_per_ns), 0u);
    out.ns_runs = calls / static_cast<std::size_t>(products_per_ns);
    out.batched = (after.batched_matrices - before.batched_matrices) /
                  static_cast<std::size_t>(products_per_ns);
  }
  for (const DeviceMatrix& w : weights)
    out.shards.push_back(to_host(compute, w.view()));
  out.info = muon.parameters();
  return out;
}

void expect_same_bits(const Result& a, const Result& b, const std::string& what) {
  test::expect_same_bits(a.shards, b.shards, what, "weight", "differs from its own NS");
}

MuonOptions options(TpMode mode) {
  MuonOptions o;
  o.tp_mode = mode;
  o.weight_decay = 0.01;
  return o;
}

// The groups owner index `me` orthogonalises per step, summed over the pipelined chunks of the
// bucket (each chunk's equal shapes run together): the optimizer's own plan (ns_flops_cost's LPT
// over `homes`, chunk_starts), its owners checked against the optimizer's.
std::size_t owner_groups(const Model& model, const Result& r, const MuonOptions& o, int homes,
                         int me) {
  const NsOptions ns = o.ns_options();
  std::vector<double> costs;
  for (const TestLayout& l : model.layouts)
    costs.push_back(ns_flops(l.m, l.n, ns));
  const detail::OwnerPlan plan = detail::plan_owners(costs, homes);
  for (std::size_t i = 0; i < model.layouts.size(); ++i) {
    EXPECT_EQ(r.info[i].owners.size(), 1u);
    if (!r.info[i].owners.empty()) EXPECT_EQ(r.info[i].owners[0], plan.owners[i]) << i;
  }
  const auto starts = detail::chunk_starts(plan, detail::OwnerOrthogonalizer::kDefaultPipeline);
  std::size_t groups = 0;
  for (std::size_t c = 0; c + 1 < starts.size(); ++c) {
    std::set<int> in_chunk;
    for (std::size_t k = starts[c]; k < starts[c + 1]; ++k) {
      const std::size_t i = plan.order[k];
      if (plan.owners[i] == me) in_chunk.insert(model.group[i]);
    }
    groups += in_chunk.size();
  }
  return groups;
}

// Duplicated: every rank gathers and runs every weight's NS, in three groups; blockwise runs
// its blocks' NS locally, in three groups as well.
TEST(GroupedNs, DuplicatedRunsOneBatchPerShape) {
  const ProcessGroups groups = test::tp_gtp_world();
  const Model model = model_for(groups.tp_size, groups.gtp_size);
  for (const TpMode mode : {TpMode::kDuplicated, TpMode::kBlockwise}) {
    SCOPED_TRACE(to_string(mode));
    auto opaque = make_opaque_compute();
    const Result grouped = run(model, options(mode), groups, *opaque);
    expect_same_bits(grouped, run(model, options(mode), groups, cpu_compute()), "cpu");
    // Blockwise: this rank's blocks of one shape are one group too (its local NS).
    EXPECT_EQ(grouped.ns_runs, 3u);
    EXPECT_EQ(grouped.batched, 7u);  // the groups of 4 and 3 batched, the single one alone
  }
}

// A batched parameter's slices (ParamSpec::batch) join the 2-D weights of their shape: one
// group of 3 + 3 matrices, bit-equal to their own NS.
TEST(GroupedNs, BatchedParameterJoinsItsShape) {
  const ProcessGroups groups = test::tp_gtp_world();
  Model model = model_for(groups.tp_size, groups.gtp_size);
  model.batch.assign(model.layouts.size(), 1);
  model.batch[2] = 3;  // weights 0, 4, 6 and the three slices of weight 2: 64 x 48
  auto opaque = make_opaque_compute();
  const MuonOptions o = options(TpMode::kDuplicated);
  const Result grouped = run(model, o, groups, *opaque);
  expect_same_bits(grouped, run(model, o, groups, cpu_compute()), "cpu");
  EXPECT_EQ(grouped.ns_runs, 3u);
  EXPECT_EQ(grouped.batched, 9u);
}

// Both algorithms at every precision (the scattered matrices staged equally strided, or at
// bf16 storage in newton_schulz_bf16's scratch): each weight's own bits.
TEST(GroupedNs, AlgorithmsAndPrecisions) {
  const ProcessGroups groups = test::tp_gtp_world();
  const Model model = model_for(groups.tp_size, groups.gtp_size);
  for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    for (const Precision precision : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
      MuonOptions o = options(TpMode::kDuplicated);
      o.ns_algorithm = algorithm;
      o.precision = precision;
      const std::string what = fmt::format("{} {}", to_string(algorithm), to_string(precision));
      auto opaque = make_opaque_compute();
      const Result grouped = run(model, o, groups, *opaque, std::nullopt, false);
      expect_same_bits(grouped, run(model, o, groups, cpu_compute(), std::nullopt, false), what);
    }
  }
}

// Owner mode over the T x G grid: each owner runs its weights of each pipelined chunk in
// groups of equal shape.
TEST(GroupedNs, OwnerRunsOneBatchPerShapeAndChunk) {
  const ProcessGroups groups = test::tp_gtp_world();
  const Model model = model_for(groups.tp_size, groups.gtp_size);
  const MuonOptions o = options(TpMode::kOwner);
  auto opaque = make_opaque_compute();
  const Result grouped = run(model, o, groups, *opaque);
  expect_same_bits(grouped, run(model, o, groups, cpu_compute()), "cpu");
  expect_same_bits(grouped, run(model, options(TpMode::kDuplicated), groups, cpu_compute()),
                   "duplicated");
  if (test::world().size() == 1) {  // every weight local
    EXPECT_EQ(grouped.ns_runs, 3u);
    return;
  }
  const int me = groups.tp.rank() + groups.tp_size * groups.gtp.rank();
  EXPECT_EQ(grouped.ns_runs, owner_groups(model, grouped, o, groups.tp_size * groups.gtp_size, me));
}

// Replicated unsharded weights: on one home of their replicas (owner mode's homes, by chunk) and
// on every rank (local NS, three groups).
TEST(GroupedNs, ReplicatedHomesAndEveryRank) {
  const Communicator& w = test::world();
  const ProcessGroups single = make_process_groups(w, 1, 1);
  const Model model = model_for(1, 1);
  MuonOptions home = options(TpMode::kDuplicated);
  home.replica_mode = ReplicaMode::kHome;
  MuonOptions every = home;
  every.replica_mode = ReplicaMode::kEveryRank;
  auto opaque = make_opaque_compute();
  const Result homes = run(model, home, single, *opaque, w);
  const Result reference = run(model, every, single, cpu_compute(), w);
  expect_same_bits(homes, reference, "homes");
  const Result everywhere = run(model, every, single, *opaque, w);
  expect_same_bits(everywhere, reference, "every rank");
  EXPECT_EQ(everywhere.ns_runs, 3u);
  if (w.size() == 1) {
    EXPECT_EQ(homes.ns_runs, 3u);
    return;
  }
  EXPECT_EQ(homes.ns_runs, owner_groups(model, homes, home, w.size(), w.rank()));
}

// A non-finite NS input in one weight of a group (rank 0's momentum of w4) ends the step on
// every rank, naming that weight, as for a weight run on its own.
TEST(GroupedNs, NonFiniteInputNamesItsWeight) {
  const ProcessGroups groups = test::tp_gtp_world();
  const Model model = model_for(groups.tp_size, groups.gtp_size);
  auto opaque = make_opaque_compute();
  Muon muon(options(TpMode::kDuplicated), test::world(), *opaque);
  std::vector<DeviceMatrix> weights, grads;
  std::vector<ConstMatrixView> views;
  for (std::size_t i = 0; i < model.layouts.size(); ++i) {
    const TestLayout& l = model.layouts[i];
    const Matrix s =
        test::shard_for(test::random_matrix(l.m, l.n, 1 + i).view(), l,
                        l.tp > 1 ? groups.tp.rank() : 0, l.gtp > 1 ? groups.gtp.rank() : 0);
    weights.push_back(to_device(*opaque, s.view()));
    grads.push_back(to_device(*opaque, s.view()));
    views.push_back(grads.back().view());
    muon.add_parameter(
        test::layout_spec(l, groups, weights.back().view(), "w" + std::to_string(i)));
  }
  muon.step(views);
  if (test::world().rank() == 0) {
    const MatrixView m = muon.state_tensors(4).at(0);
    Matrix host = to_host(*opaque, m);
    host(0, 0) = std::numeric_limits<float>::quiet_NaN();
    opaque->copy_from_host(host.view(), m);
  }
  try {
    muon.step(views);
    ADD_FAILURE() << "a non-finite momentum stepped";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("'w4'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distmuon
