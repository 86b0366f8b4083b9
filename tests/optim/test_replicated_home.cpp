// Replicated weights (ParamSpec::dp_group) orthogonalised once, on one LPT-balanced home of their
// replicas (replica_mode home), against every replica running its own NS (every_rank): the same
// bits on every rank (tolerance 0: the home runs the code every replica would run, on the same
// bits, and the exchange only copies), the NS products of the world divided by the replicas (each
// rank runs only its homes' NS, counted by a counting Compute), and a replica that differs is an
// error on every rank, before anything is updated.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "distmuon/precision.h"
#include "distmuon/tp.h"
#include "optim_test_util.h"
#include "tp/owner_ns.h"

namespace distmuon {
namespace {

using test::CountingCompute;
using test::TestLayout;

// The weights of a run: full shapes (rows, cols), TP-split along tp_dim over T ranks when T > 1.
struct Shape {
  Index m, n;
  int tp_dim;
};

struct RunResult {
  std::vector<Matrix> weights;  // this rank's shards after the steps
  double products = 0;          // this rank's NS products (gemm + syrk)
  std::vector<ParamInfo> info;
};

// World = T TP ranks x D replicas (TP fastest). Every replica holds the same shards; three steps
// with the same gradients on every replica (as after a data-parallel all-reduce).
RunResult run(const std::vector<Shape>& shapes, int T, TpMode mode, ReplicaMode replicas,
              int differing_rank = -1, ReplicaWire wire = ReplicaWire::kFp32, int steps = 3) {
  const Communicator& world = test::world();
  const ProcessGroups groups = make_process_groups(world, T, 1);
  const int t = world.rank() % T;
  const Communicator dp = world.split(t, world.rank());  // the ranks with this TP rank
  MuonOptions o;
  o.tp_mode = mode;
  o.replica_mode = replicas;
  o.replica_wire = wire;
  o.weight_decay = 0.01;
  CountingCompute counting;
  Muon muon(o, world, counting);
  RunResult out;
  std::vector<TestLayout> layouts;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    TestLayout l{.m = shapes[k].m, .n = shapes[k].n};
    if (T > 1) {
      l.tp_dim = shapes[k].tp_dim;
      l.tp = T;
    }
    layouts.push_back(l);
    out.weights.push_back(test::shard_for(test::random_matrix(l.m, l.n, 1 + k).view(), l, t, 0));
    if (static_cast<int>(k) == 1 && world.rank() == differing_rank)
      out.weights.back().data()[0] += 1.0f;
  }
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    ParamSpec s =
        test::layout_spec(layouts[k], groups, out.weights[k].view(), "w" + std::to_string(k));
    s.dp_group = dp;
    muon.add_parameter(s);
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<Matrix> grads;
    std::vector<ConstMatrixView> views;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const TestLayout& l = layouts[k];
      grads.push_back(test::shard_for(
          test::random_matrix(l.m, l.n, 100 + 10 * static_cast<unsigned>(step) + k).view(), l, t,
          0));
    }
    for (const Matrix& g : grads)
      views.push_back(g.view());
    muon.step(views);
  }
  out.products = counting.calls["gemm"] + counting.calls["syrk"];
  out.info = muon.parameters();
  return out;
}

bool bit_equal(const Matrix& a, const Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0;
}

void expect_home_equals_every_rank(const std::vector<Shape>& shapes, int T, TpMode mode) {
  const Communicator& world = test::world();
  const int D = world.size() / T;
  const RunResult home = run(shapes, T, mode, ReplicaMode::kHome);
  const RunResult every = run(shapes, T, mode, ReplicaMode::kEveryRank);
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    SCOPED_TRACE("weight " + std::to_string(k));
    EXPECT_TRUE(bit_equal(home.weights[k], every.weights[k]));
    EXPECT_EQ(home.info[k].dp_size, D);
    EXPECT_TRUE(home.info[k].home);
    EXPECT_FALSE(every.info[k].home);
    EXPECT_GE(home.info[k].owner, 0);
    EXPECT_LT(home.info[k].owner, world.size());
  }
  // Each weight's NS runs once over its replicas instead of once per replica.
  const double world_home = world.all_reduce(home.products);
  const double world_every = world.all_reduce(every.products);
  EXPECT_GT(world_home, 0);
  EXPECT_EQ(world_home * D, world_every);
  // Unsharded, every replica runs every weight's NS; with a home each rank runs fewer (LPT
  // spreads more weights than ranks over every rank). Owner mode splits within a replica anyway.
  if (T == 1) EXPECT_LT(home.products, every.products);
}

// Unsharded weights replicated over the whole world (DDP), in tp_mode auto and duplicated.
TEST(ReplicatedHome, UnshardedWeightsOverTheWorldAreBitEqualToEveryRankNs) {
  const std::vector<Shape> shapes = {{48, 32, 0}, {32, 80, 0}, {40, 40, 0}, {24, 56, 0},
                                     {64, 16, 0}, {16, 16, 0}, {56, 24, 0}, {36, 28, 0}};
  for (const TpMode mode : {TpMode::kAuto, TpMode::kDuplicated}) {
    SCOPED_TRACE(to_string(mode));
    expect_home_equals_every_rank(shapes, 1, mode);
  }
  // replica_mode auto, tp_mode auto: the cost model (no profile: FLOPs, the exchange free) gives
  // 8 weights over 2 or 4 replicas homes; bit-equal still.
  const RunResult autos = run(shapes, 1, TpMode::kAuto, ReplicaMode::kAuto);
  const RunResult every = run(shapes, 1, TpMode::kAuto, ReplicaMode::kEveryRank);
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    EXPECT_TRUE(autos.info[k].home);
    EXPECT_TRUE(bit_equal(autos.weights[k], every.weights[k]));
  }
}

// TP 2 x 2 replicas (4 ranks): owner mode's homes span the replicas.
TEST(ReplicatedHome, OwnerModeHomesSpanTheReplicas) {
  if (test::world().size() % 4 != 0) GTEST_SKIP() << "needs TP 2 x 2 replicas";
  const std::vector<Shape> shapes = {{48, 32, 0}, {32, 80, 1}, {40, 40, 0},
                                     {24, 56, 1}, {64, 16, 0}, {16, 16, 1}};
  expect_home_equals_every_rank(shapes, 2, TpMode::kOwner);
}

// The pipelined schedule (the results sent in chunks, each started while the next chunk's NS runs)
// gives the serial schedule's bits, over an emulated link too; every rank ends with the same
// result of every weight.
TEST(ReplicatedHome, PipelinedExchangeIsBitEqualToTheSerialSchedule) {
  const Communicator& world = test::world();
  const std::vector<Shape> shapes = {{48, 32, 0}, {32, 80, 0}, {40, 40, 0}, {24, 56, 0},
                                     {64, 16, 0}, {16, 16, 0}, {56, 24, 0}};
  const Communicator one = local_communicator();
  const Communicator slow = emulated_link_communicator(world, {1e-3, 1e9});
  NsOptions ns;
  const ScaleFn unit = [](Index, Index) { return 1.0; };
  auto run = [&](int chunks, const Communicator& dp) {
    std::vector<ShardLayout> layouts;
    std::vector<Matrix> work;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      layouts.push_back(
          {.m = shapes[k].m, .n = shapes[k].n, .dp_size = world.size(), .dp_rank = world.rank()});
      work.push_back(test::random_matrix(shapes[k].m, shapes[k].n, 7 + k));
    }
    std::vector<detail::OwnerOrthogonalizer::Weight> weights;
    for (std::size_t k = 0; k < shapes.size(); ++k)
      weights.push_back({work[k].view(), &layouts[k], &one, &one, NsAlgorithm::kStandard, &dp});
    detail::OwnerOrthogonalizer orth(detail::ns_flops_cost(ns), chunks);
    orth.run(weights, ns, unit, cpu_compute());
    return work;
  };
  const std::vector<Matrix> serial = run(1, world);
  for (const int chunks : {2, 3, 7, 100}) {
    for (const Communicator* dp : {&world, &slow}) {
      const std::vector<Matrix> piped = run(chunks, *dp);
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        EXPECT_TRUE(bit_equal(piped[k], serial[k])) << chunks << " chunks, weight " << k;
        // Every replica holds the same result: rank 0's bytes, compared on every rank.
        Matrix root = piped[k];
        world.broadcast<float>({root.data(), static_cast<std::size_t>(root.size())}, 0);
        EXPECT_TRUE(bit_equal(root, piped[k]));
      }
    }
  }
}

// The bf16 wire: the home rounds its result to bf16 and sends that, so every replica holds
// exactly the fp32 wire's result rounded to bf16 (to nearest even), on the CPU and on the opaque
// backend (tolerance 0: the rounding is the only difference).
TEST(ReplicatedHome, Bf16WireGivesTheFp32ResultRoundedOnEveryReplica) {
  const Communicator& world = test::world();
  const std::vector<Shape> shapes = {{48, 32, 0}, {32, 80, 0}, {40, 40, 0}, {24, 56, 0}, {8, 8, 0}};
  NsOptions ns;
  const ScaleFn unit = [](Index, Index) { return 1.0; };
  const Communicator one = local_communicator();
  auto run_on = [&](Compute& compute, bool bf16) {
    std::vector<ShardLayout> layouts;
    std::vector<DeviceMatrix> work;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      layouts.push_back(
          {.m = shapes[k].m, .n = shapes[k].n, .dp_size = world.size(), .dp_rank = world.rank()});
      work.push_back(
          to_device(compute, test::random_matrix(shapes[k].m, shapes[k].n, 7 + k).view()));
    }
    const Communicator dp = compute.data_communicator(world);  // the backend's memory moves
    std::vector<detail::OwnerOrthogonalizer::Weight> weights;
    for (std::size_t k = 0; k < shapes.size(); ++k)
      weights.push_back({work[k].view(), &layouts[k], &one, &one, NsAlgorithm::kStandard, &dp});
    detail::OwnerOrthogonalizer orth(detail::ns_flops_cost(ns), 2, bf16);
    orth.run(weights, ns, unit, compute);
    std::vector<Matrix> out;
    for (const DeviceMatrix& w : work)
      out.push_back(to_host(compute, w.view()));
    return out;
  };
  const std::vector<Matrix> fp32 = run_on(cpu_compute(), false);
  for (const char* backend : {"cpu", "opaque"}) {
    const std::vector<Matrix> bf16 = run_on(compute_backend(backend), true);
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      SCOPED_TRACE(std::string(backend) + " weight " + std::to_string(k));
      Matrix rounded = fp32[k];
      for (float& v : rounded.values())
        v = round_to(Precision::kBf16, v);
      EXPECT_TRUE(bit_equal(bf16[k], rounded));
      EXPECT_FALSE(bit_equal(bf16[k], fp32[k]));
    }
  }
}

// Through the optimizer (MuonOptions::replica_wire): one step, the replicas equal, each element
// of the step's change within bf16's rounding (2^-8 relative) of the fp32 wire's update
// (lr s u = -(w1 - w0) - lr wd w0 with decoupled decay), plus a few fp32 roundings of the weight.
TEST(ReplicatedHome, Bf16WireThroughTheOptimizer) {
  const Communicator& world = test::world();
  const std::vector<Shape> shapes = {{48, 32, 0}, {32, 80, 0}, {40, 40, 0}};
  const RunResult f = run(shapes, 1, TpMode::kAuto, ReplicaMode::kHome, -1, ReplicaWire::kFp32, 1);
  const RunResult b = run(shapes, 1, TpMode::kAuto, ReplicaMode::kHome, -1, ReplicaWire::kBf16, 1);
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    SCOPED_TRACE("weight " + std::to_string(k));
    const Matrix w0 = test::random_matrix(shapes[k].m, shapes[k].n, 1 + k);
    EXPECT_FALSE(bit_equal(b.weights[k], f.weights[k]));
    Matrix root = b.weights[k];
    world.broadcast<float>({root.data(), static_cast<std::size_t>(root.size())}, 0);
    EXPECT_TRUE(bit_equal(root, b.weights[k]));
    for (Index i = 0; i < w0.size(); ++i) {
      const double x0 = w0.data()[i], xf = f.weights[k].data()[i], xb = b.weights[k].data()[i];
      const double update = std::abs(xf - x0 + 0.02 * 0.01 * x0);
      EXPECT_LE(std::abs(xb - xf), std::ldexp(update, -8) + std::ldexp(std::abs(x0), -21));
    }
  }
}

// Later steps (the homes known before the step: NS inputs written straight into the send staging,
// results left where they arrive) on a bf16 wire: every replica still holds the same bits.
TEST(ReplicatedHome, Bf16WireKeepsTheReplicasEqualOverSteps) {
  const Communicator& world = test::world();
  const std::vector<Shape> shapes = {{48, 32, 0}, {32, 80, 0}, {40, 40, 0}, {24, 56, 0}};
  const RunResult b = run(shapes, 1, TpMode::kAuto, ReplicaMode::kHome, -1, ReplicaWire::kBf16, 3);
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    Matrix root = b.weights[k];
    world.broadcast<float>({root.data(), static_cast<std::size_t>(root.size())}, 0);
    EXPECT_TRUE(bit_equal(root, b.weights[k])) << "weight " << k;
  }
}

TEST(ReplicatedHome, AReplicaThatDiffersFailsOnEveryRank) {
  const Communicator& world = test::world();
  const std::vector<Shape> shapes = {{48, 32, 0}, {32, 80, 0}, {40, 40, 0}};
  try {
    run(shapes, 1, TpMode::kAuto, ReplicaMode::kHome, world.size() - 1);
    ADD_FAILURE() << "no error";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("the replicas of weight 'w1' differ"), std::string::npos)
        << e.what();
  }
}

// The update checks of a weight homed on another replica read its result where it arrived: a step
// past float32's range (a learning rate of 3e38; a weight of every replica at the largest float)
// is refused on every rank, before anything is written.
TEST(ReplicatedHome, TheHomesUpdateChecksHoldOnEveryReplica) {
  const Communicator& world = test::world();
  const ProcessGroups groups = make_process_groups(world, 1, 1);
  auto refused = [&](MuonOptions o, float weight) {
    o.replica_mode = ReplicaMode::kHome;
    Muon muon(o, world, cpu_compute());
    std::vector<Matrix> weights, grads;
    std::vector<ConstMatrixView> views;
    for (std::size_t k = 0; k < 4; ++k) {
      const TestLayout l{.m = 24 + 8 * static_cast<Index>(k), .n = 32};
      weights.push_back(test::random_matrix(l.m, l.n, 1 + k));
      grads.push_back(test::random_matrix(l.m, l.n, 100 + k));
      ParamSpec s = test::layout_spec(l, groups, weights[k].view(), "w" + std::to_string(k));
      s.dp_group = world;
      muon.add_parameter(s);
    }
    weights[1].data()[0] = weight;
    for (const Matrix& g : grads)
      views.push_back(g.view());
    const std::vector<Matrix> before = weights;
    try {
      muon.step(views);
      ADD_FAILURE() << "the step was taken";
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("could take its weights past float32's range"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(muon.step_count(), 0);
    for (std::size_t k = 0; k < weights.size(); ++k)
      EXPECT_TRUE(bit_equal(weights[k], before[k])) << "weight " << k;
    // Each weight was homed on one rank: the others took its update from it.
    for (const ParamInfo& p : muon.parameters()) {
      EXPECT_TRUE(p.home);
      EXPECT_GE(p.owner, 0);
    }
  };
  refused({.lr = 3e38}, 0.5f);
  refused({}, std::numeric_limits<float>::max());
}

}  // namespace
}  // namespace distmuon
