// The step simulation: each mode's per-rank time is the refined cost model's for the rank's
// weights (checked against the cost model called by hand), replicated-home of unsharded weights
// is the replica bucket's estimate (LPT homes, the results' all-to-all, on the buckets'
// schedule), batching pays a batch's latency once, auto takes per class the fastest
// busiest rank, and the optimizer state follows the sharding option.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/plan.h"
#include "distmuon/step_simulation.h"

namespace distmuon {
namespace {

SimulationOptions gb200() {
  SimulationOptions o;
  o.profile = *resolve_profile("gb200");
  return o;
}

// Relative tolerance: the simulation sums the same doubles in another order.
void expect_close(double got, double want, const char* what) {
  EXPECT_NEAR(got, want, 1e-9 * std::abs(want)) << what;
}

TEST(StepSimulation, ModesArePricedByTheCostModel) {
  // tp 2 on 2 ranks: fc1 column-parallel (rows split), fc2 row-parallel (columns split).
  const Placement pl({{"mlp.fc1", 2048, 512, 0, 1, 0, TpSplit::kColumn},
                      {"mlp.fc2", 512, 2048, 0, 1, 0, TpSplit::kRow}},
                     parse_parallelism("tp=2"), 72);
  const SimulationOptions o = gb200();
  const StepSimulation sim = simulate_step(pl, o);
  AutoKey fc1{2048, 512, 2, 0};
  fc1.elem_size = 2;
  AutoKey fc2{512, 2048, 2, 1};
  fc2.elem_size = 2;
  const CostEstimate e1 = estimate_refined(fc1, &o.profile), e2 = estimate_refined(fc2, &o.profile);
  expect_close(sim.of(StepMode::kDuplicated).seconds(),
               e1.duplicated.seconds() + e2.duplicated.seconds(), "duplicated");
  expect_close(sim.of(StepMode::kDistributed).seconds(),
               e1.distributed.seconds() + e2.distributed.seconds(), "distributed");
  expect_close(sim.of(StepMode::kDistributed).step().comm_s(),
               e1.distributed.comm_s() + e2.distributed.comm_s(), "distributed comm");
  // Owner: one bucket per group shape (fc1 and fc2 share tp 2, not the partition dim).
  const AutoKey keys[] = {fc1, fc2};
  const CostEstimate ests[] = {e1, e2};
  const OwnerBucketEstimate owner = estimate_owner_bucket(keys, ests, &o.profile);
  expect_close(sim.of(StepMode::kOwner).seconds(), owner.cost(), "owner");
  // No replicas: replicated-home is each weight in its per-weight best mode.
  expect_close(sim.of(StepMode::kReplicatedHome).seconds(), e1.best_cost() + e2.best_cost(),
               "replicated-home");
  EXPECT_EQ(sim.modes.size(), std::size(kStepModes));
}

// One group of two ranks splitting every weight by rows (gtp 2, as `bench --model` shards them):
// the simulation is `plan -G 2` (its totals per mode and its owner bucket), which
// docs/cost-model.md holds against `bench --model` measured with a calibrated profile.
TEST(StepSimulation, OneGroupIsThePlan) {
  SimulationOptions o = gb200();
  o.elem_size = 4;
  PlanOptions po;
  po.group_size = 2;
  po.elem_size = 4;
  po.profile = o.profile;
  const Plan plan = make_plan(train_default_weights(), po);
  ASSERT_TRUE(plan.owner.has_value());
  // Owner's schedule in the optimizer, which the plan prices: the cost model's chunk count.
  o.buckets = plan.owner->chunks;
  const Placement pl(layered_weights(train_default_weights()), parse_parallelism("dp=2,gtp=2"), 2);
  const StepSimulation sim = simulate_step(pl, o);
  expect_close(sim.of(StepMode::kDuplicated).seconds(), plan.total_duplicated, "duplicated");
  expect_close(sim.of(StepMode::kDistributed).seconds(), plan.total_distributed, "distributed");
  ASSERT_TRUE(plan.owner.has_value());
  expect_close(sim.of(StepMode::kOwner).seconds(), plan.owner->cost(), "owner");
}

// dp 4, one 512 x 512 weight in each of 4 layers, unsharded: the executor's homes
// (estimate_replica_bucket: one home each, the results' all-to-all, on the buckets' schedule).
TEST(StepSimulation, ReplicatedHomeOfUnshardedWeightsIsTheReplicaBucket) {
  const Placement pl({{"attn.qkv", 512, 512, 0, 4, 0, TpSplit::kColumn}}, parse_parallelism("dp=4"),
                     72);
  SimulationOptions o = gb200();
  AutoKey key{512, 512, 1, 0};
  key.elem_size = 2;
  const CostEstimate e = estimate_refined(key, &o.profile);
  const double ns = e.duplicated.compute_s + e.duplicated.elementwise_s;
  const double bytes = 4.0 * 512 * 512 * 4;  // 4 weights, fp32 on the wire
  const double alpha = o.profile.latency_us(false) * 1e-6;
  const double wire = bytes * 3 / 4 / (o.profile.bandwidth_gbps(4, false) * 1e9);
  const std::vector<AutoKey> keys(4, key);
  for (const int buckets : {1, 2}) {
    o.buckets = buckets;
    const StepSimulation sim = simulate_step(pl, o);
    const ReplicaBucketEstimate want = estimate_replica_bucket(
        keys, 4, false, &o.profile, CostModel::kRefined, 4.0, {buckets, {}});
    const ModeStep& home = sim.of(StepMode::kReplicatedHome);
    expect_close(home.step().ns_s(), ns, "home NS: one weight");
    expect_close(home.step().comm_s(), want.comm_s, "the results' all-to-all, serial");
    expect_close(home.seconds(), want.home_cost(), "on the schedule");
    // Each home sends its result to the 3 others: the ring all-gather's bytes and latencies.
    expect_close(want.comm_s, wire + 3 * alpha, "serial exchange");
    // Every rank runs all four weights in the other modes, then (the optimizer state being
    // sharded layer-wise by default) the parameters are all-gathered, in one bucket.
    expect_close(sim.of(StepMode::kDuplicated).seconds(),
                 4 * e.duplicated.seconds() + wire + 3 * alpha, "dup");
  }
  // Momentum: 4 weights of 512 x 512 fp32 on every replica, a quarter with ZeRO-1, one weight
  // each layer-wise.
  const double all = 4.0 * 512 * 512 * 4;
  for (const auto& [sharding, want] :
       {std::pair{OptimizerSharding::kNone, all}, std::pair{OptimizerSharding::kZero1, all / 4},
        std::pair{OptimizerSharding::kLayerwise, all / 4}}) {
    Parallelism par = pl.parallelism();
    par.sharding = sharding;
    const StepSimulation sim = simulate_step(Placement(pl.weights(), par, 72), gb200());
    EXPECT_DOUBLE_EQ(sim.momentum_bytes, want) << to_string(sharding);
  }
}

// Which work each rank owns: every rank runs all four weights duplicated; replicated-home gives
// each weight one home, the same on every rank, and each of the 4 ranks one weight.
TEST(StepSimulation, RankWorkNamesEachWeightsHome) {
  const Placement pl({{"attn.qkv", 512, 512, 0, 4, 0, TpSplit::kColumn}}, parse_parallelism("dp=4"),
                     72);
  const SimulationOptions o = gb200();
  std::vector<int> home(4, -1);
  for (int rank = 0; rank < 4; ++rank) {
    const std::vector<RankWork> dup = rank_work(pl, o, rank, StepMode::kDuplicated);
    ASSERT_EQ(dup.size(), 4u);
    for (const RankWork& w : dup)
      EXPECT_EQ(w.work, NsWork::kWhole);
    const std::vector<RankWork> work = rank_work(pl, o, rank, StepMode::kReplicatedHome);
    ASSERT_EQ(work.size(), 4u);
    int here = 0;
    for (const RankWork& w : work) {
      const int at = w.work == NsWork::kElsewhere ? w.home : rank;
      EXPECT_TRUE(w.work == NsWork::kElsewhere || w.work == NsWork::kWhole);
      auto& agreed = home[static_cast<std::size_t>(w.layer)];
      if (agreed < 0) agreed = at;
      EXPECT_EQ(agreed, at) << "layer " << w.layer << " seen from rank " << rank;
      here += w.work == NsWork::kWhole ? 1 : 0;
    }
    EXPECT_EQ(here, 1) << rank;
  }
  std::sort(home.begin(), home.end());
  EXPECT_EQ(home, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_THROW(rank_work(pl, o, 0, StepMode::kAuto), Error);
}

TEST(StepSimulation, BatchedExpertsPayTheirLatencyOnce) {
  // 8 experts of one layer on 2 ranks with etp 2: ep 1, so each rank holds all 8 (sharded).
  const Placement pl({{"attn.qkv", 64, 64, 0, 1, 0, TpSplit::kColumn},
                      {"expert.fc1", 256, 128, 0, 1, 8, TpSplit::kColumn}},
                     parse_parallelism("tp=2"), 72);
  SimulationOptions o = gb200();
  const StepSimulation batched = simulate_step(pl, o);
  o.batch_experts = false;
  const StepSimulation single = simulate_step(pl, o);
  AutoKey key{256, 128, 2, 0};
  key.elem_size = 2;
  const CostEstimate e = estimate_refined(key, &o.profile);
  for (const StepMode m : {StepMode::kDuplicated, StepMode::kDistributed}) {
    const ClassStep& b = batched.of(m).step().expert;
    const ClassStep& s = single.of(m).step().expert;
    EXPECT_EQ(b.weights, 8);
    expect_close(b.ns_s, s.ns_s, "same NS");
    const double latency = (m == StepMode::kDuplicated ? e.duplicated : e.distributed).latency_s;
    expect_close(s.comm_s - b.comm_s, 7 * latency, "seven latencies saved");
  }
}

TEST(StepSimulation, AutoTakesTheFastestModePerClass) {
  const Placement pl(layered_weights(resolve_model("qwen3-30b-a3b")),
                     parse_parallelism("tp=2,pp=2,dp=8,ep=8,etp=1"), 72);
  const StepSimulation sim = simulate_step(pl, gb200());
  const ModeStep& a = sim.of(StepMode::kAuto);
  const auto busiest = [](const ModeStep& m, bool expert) {
    double most = 0;
    for (const RankStep& r : m.ranks)
      most = std::max(most, expert ? r.expert.seconds : r.dense.seconds);
    return most;
  };
  for (const StepMode m : kStepModes) {
    if (m == StepMode::kAuto) continue;
    EXPECT_LE(busiest(sim.of(a.dense_choice), false), busiest(sim.of(m), false)) << to_string(m);
    EXPECT_LE(busiest(sim.of(a.expert_choice), true), busiest(sim.of(m), true)) << to_string(m);
  }
  // The busiest rank is the slowest of all.
  for (const ModeStep& m : sim.modes)
    for (const RankStep& r : m.ranks)
      EXPECT_LE(r.seconds(), m.seconds());
  EXPECT_TRUE(sim.has_experts);
}

TEST(StepSimulation, KimiK2OnTwoHundredFiftySixGpus) {
  Parallelism par = parse_parallelism("pp=4,vpp=4,ep=64,etp=1,dp=64");
  par.sharding = OptimizerSharding::kNone;
  const Placement pl(layered_weights(resolve_model("kimi-k2")), par, 72);
  SimulationOptions o;
  o.profile = *resolve_profile("gb300");
  const StepSimulation sim = simulate_step(pl, o);
  const ModeStep& dup = sim.of(StepMode::kDuplicated);
  EXPECT_EQ(dup.ranks.size(), 256u);
  EXPECT_LT(dup.busiest, 64);  // pipeline rank 0: 16 layers, the dense one among them
  // No group shards a weight (tp 1, etp 1) and the optimizer state is not sharded: no mode
  // communicates but replicated-home.
  EXPECT_EQ(dup.step().comm_s(), 0);
  EXPECT_GT(sim.of(StepMode::kReplicatedHome).step().comm_s(), 0);
  // Layer-wise sharding: the duplicated step also all-gathers the dense parameters over dp.
  par.sharding = OptimizerSharding::kLayerwise;
  const StepSimulation layerwise = simulate_step(Placement(pl.weights(), par, 72), o);
  EXPECT_GT(layerwise.of(StepMode::kDuplicated).step().dense.comm_s, 0);
  EXPECT_EQ(layerwise.of(StepMode::kDuplicated).step().expert.comm_s, 0);  // edp 1
  EXPECT_THROW(
      {
        o.buckets = 0;
        simulate_step(pl, o);
      },
      Error);
}

}  // namespace
}  // namespace distmuon
