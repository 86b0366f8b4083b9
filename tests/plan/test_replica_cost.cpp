// The cost model's replicated bucket (estimate_replica_bucket): homes by LPT on the FLOPs, every
// rank's cost the sum of the bucket's NS, the home's the busiest home plus the results' all-to-all
// (the busiest rank's bytes at the bandwidth, replicas - 1 latencies), in a case built for each
// outcome. Costs are compared as the model computes them (no tolerance: the same arithmetic).
#include <gtest/gtest.h>

#include <vector>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/plan.h"

namespace distmuon {
namespace {

AutoKey key(Index m, Index n, int g = 1) {
  return AutoKey{.m = m, .n = n, .group_size = g, .steps = 5, .use_syrk = true, .elem_size = 4};
}

HardwareProfile profile(double gbps, double latency_us) {
  HardwareProfile p;
  p.name = "test";
  p.peak_tflops_bf16 = 0.2;  // a slow device: NS of a 1024^2 weight takes milliseconds
  p.peak_tflops_fp32 = 0.1;
  p.intra_domain_gbps = gbps;
  p.inter_domain_gbps = gbps;
  p.intra_domain_latency_us = latency_us;
  p.inter_domain_latency_us = latency_us;
  p.domain_size = 8;
  p.source = "test";
  return p;
}

TEST(ReplicaCost, WithoutAProfileTheBusiestHomeAgainstEveryRank) {
  const std::vector<AutoKey> keys = {key(512, 256), key(256, 256), key(256, 128), key(128, 128)};
  const ReplicaBucketEstimate e =
      estimate_replica_bucket(keys, 2, false, nullptr, CostModel::kRefined);
  std::vector<double> flops;
  double total = 0;
  for (const AutoKey& k : keys) {
    flops.push_back(estimate(k, nullptr, CostModel::kRefined).cost(TpMode::kDuplicated));
    total += flops.back();
  }
  EXPECT_EQ(e.homes, lpt_assign(flops, 2));
  EXPECT_EQ(e.every_rank, total);
  EXPECT_EQ(e.comm_s, 0.0);
  EXPECT_LT(e.compute, total);
  EXPECT_GE(e.compute, total / 2);
  EXPECT_TRUE(e.chose_home());
  // One weight: its home does what every rank does; the tie stays with every rank.
  const ReplicaBucketEstimate one = estimate_replica_bucket(std::vector<AutoKey>{key(256, 256)}, 4,
                                                            false, nullptr, CostModel::kRefined);
  EXPECT_EQ(one.compute, one.every_rank);
  EXPECT_FALSE(one.chose_home());
}

TEST(ReplicaCost, ASlowLinkKeepsEveryRankAFastOneChoosesHomes) {
  const std::vector<AutoKey> keys(8, key(1024, 1024));
  const HardwareProfile fast = profile(100, 5), slow = profile(0.01, 5);
  const ReplicaBucketEstimate f =
      estimate_replica_bucket(keys, 4, false, &fast, CostModel::kRefined);
  const ReplicaBucketEstimate s =
      estimate_replica_bucket(keys, 4, false, &slow, CostModel::kRefined);
  EXPECT_TRUE(f.chose_home());
  EXPECT_FALSE(s.chose_home());
  EXPECT_EQ(f.compute, s.compute);  // the same homes, the same NS
  // 8 equal weights, 2 per home (sums of 2 and of 8 equal terms: rounding apart).
  EXPECT_DOUBLE_EQ(f.compute * 4, f.every_rank);
  // The busiest rank sends its 2 results to 3 other replicas, fp32.
  EXPECT_EQ(f.payload_bytes, 2.0 * 3 * 4 * 1024 * 1024);
  EXPECT_GT(s.comm_s, f.comm_s);
  // The bf16 wire: half the bytes, less time on the slow link, the same NS.
  const ReplicaBucketEstimate h =
      estimate_replica_bucket(keys, 4, false, &slow, CostModel::kRefined, 2.0);
  EXPECT_EQ(h.payload_bytes, s.payload_bytes / 2);
  EXPECT_LT(h.comm_s, s.comm_s);
  EXPECT_EQ(h.compute, s.compute);
}

// plan --replicas: the model's weights (count copies per shape) unsharded over the replicas,
// priced by the same estimate; absent without replicas.
TEST(ReplicaCost, ThePlanPricesTheModelReplicated) {
  const std::vector<WeightShape> weights = {{"a", 512, 256, 3, false}, {"b", 256, 1024, 2, false}};
  PlanOptions o;
  o.group_size = 4;
  o.elem_size = 4;
  EXPECT_FALSE(make_plan(weights, o).replicated.has_value());
  o.replicas = 4;
  const Plan plan = make_plan(weights, o);
  ASSERT_TRUE(plan.replicated.has_value());
  std::vector<AutoKey> keys(3, key(512, 256));
  keys.insert(keys.end(), 2, key(256, 1024));
  const ReplicaBucketEstimate e =
      estimate_replica_bucket(keys, 4, false, nullptr, CostModel::kRefined, 4.0, {4, {}});
  EXPECT_EQ(plan.replicated->homes, e.homes);
  EXPECT_EQ(plan.replicated->every_rank, e.every_rank);
  EXPECT_EQ(plan.replicated->home_cost(), e.home_cost());
  EXPECT_NE(format_plan(plan).find("one home per weight"), std::string::npos);
}

TEST(ReplicaCost, ShardedKeysAndBadReplicaCountsAreRefused) {
  EXPECT_THROW(estimate_replica_bucket(std::vector<AutoKey>{key(64, 64, 2)}, 2, false, nullptr,
                                       CostModel::kRefined),
               Error);
  EXPECT_THROW(estimate_replica_bucket(std::vector<AutoKey>{key(64, 64)}, 0, false, nullptr,
                                       CostModel::kRefined),
               Error);
  EXPECT_THROW(estimate_replica_bucket(std::vector<AutoKey>{key(64, 64)}, 2, false, nullptr,
                                       CostModel::kRefined, 0.0),
               Error);
}

}  // namespace
}  // namespace distmuon
