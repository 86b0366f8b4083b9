// The cost model's batched parameters (AutoKey::batch: a layer's experts as one [E, m, n]
// parameter): every term is batch x one matrix's where the executor runs the matrices one by one
// (the CPU's products; distributed's collectives), duplicated's gather one collective for the
// batch (one latency, the arrivals copied into place), its products one call each where the
// backend batches them (batched_products), and owner mode and the homes spread the matrices over
// their ranks by LPT, one unit per matrix. Also: auto prices owner on the pipelined schedule the
// optimizer runs, and `plan --model` counts a batched weight once per parameter. Pure functions,
// no timing. Tolerance: relative 1e-12 (batch x a sum against the sum of batch x its terms).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "distmuon/cost_model.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/model_preset.h"
#include "distmuon/plan.h"

namespace distmuon {
namespace {

void expect_rel(double got, double want, const char* what) {
  EXPECT_NEAR(got, want, 1e-12 * std::abs(want)) << what;
}

AutoKey key(Index m, Index n, int g, Index batch, bool batched_products = false) {
  return AutoKey{.m = m,
                 .n = n,
                 .group_size = g,
                 .steps = 5,
                 .use_syrk = true,
                 .elem_size = 4,
                 .algorithm = NsAlgorithm::kAuto,
                 .batch = batch,
                 .batched_products = batched_products};
}

// A calibrated 2-rank profile; `rising`: the product rates grow with the long side (small
// products pay their launch and latency), else flat.
HardwareProfile calibrated(bool rising) {
  HardwareProfile p;
  p.name = "calibrated";
  p.peak_tflops_bf16 = p.peak_tflops_fp32 = 0.2;
  p.intra_domain_gbps = p.inter_domain_gbps = 10;
  p.intra_domain_latency_us = p.inter_domain_latency_us = 1;
  p.domain_size = 2;
  p.source = "test";
  Calibration c;
  c.elem_size = 4;
  c.group_size = 2;
  const double r = rising ? 4 : 1;
  c.gram_syrk = {{64, 4096}, {64, 4096}, {{10, 10 * r}, {20, 20 * r}}};
  c.update_gemm = {{64, 4096}, {64, 4096}, {{15, 15 * r}, {30, 30 * r}}};
  c.elementwise = {1.5, 1, 2, 0.5};
  c.all_gather = CollectiveFit{5, 12};
  c.all_reduce = CollectiveFit{4, 6};
  c.host = "host";
  c.date = "2026-01-01T00:00:00Z";
  p.calibration = c;
  return p;
}

constexpr TpMode kModes[] = {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kOwner};
constexpr NsAlgorithm kAlgorithms[] = {NsAlgorithm::kStandard, NsAlgorithm::kGram};

TEST(BatchedCost, ABatchRunMatrixByMatrixCostsBatchTimesOneMatrix) {
  const HardwareProfile p = calibrated(true);
  for (const HardwareProfile* prof : {static_cast<const HardwareProfile*>(nullptr), &p}) {
    const CostEstimate one = estimate(key(512, 256, 2, 1), prof, CostModel::kRefined);
    const CostEstimate eight = estimate(key(512, 256, 2, 8), prof, CostModel::kRefined);
    for (TpMode mode : kModes) {
      for (NsAlgorithm a : kAlgorithms) {
        const ModeCost &o = one.of(mode, a), &b = eight.of(mode, a);
        expect_rel(b.flops, 8 * o.flops, "flops");
        expect_rel(b.payload_bytes, 8 * o.payload_bytes, "payload");
        expect_rel(b.wire_bytes, 8 * o.wire_bytes, "wire bytes");
        expect_rel(b.compute_s, 8 * o.compute_s, "products");
        expect_rel(b.bandwidth_s, 8 * o.bandwidth_s, "bandwidth");
        EXPECT_EQ(b.all_reduces, 8 * o.all_reduces);
        if (mode == TpMode::kDuplicated) {
          // The batch gathered in one collective: one latency, one call, and what arrives copied
          // into place (one more pass over each gathered matrix).
          expect_rel(b.latency_s, o.latency_s, "latency");
          EXPECT_EQ(b.all_gathers, o.all_gathers);
          expect_rel(b.elementwise_elements, 8 * o.elementwise_elements + 8 * 512 * 256,
                     "elementwise");
          if (prof != nullptr) EXPECT_GT(b.elementwise_s, 8 * o.elementwise_s);
        } else {
          // Each matrix's own collectives: 8 latencies, 8 calls.
          expect_rel(b.latency_s, 8 * o.latency_s, "latency");
          EXPECT_EQ(b.all_gathers, 8 * o.all_gathers);
          expect_rel(b.elementwise_s, 8 * o.elementwise_s, "elementwise");
        }
      }
    }
    EXPECT_EQ(eight.best(), one.best());
    EXPECT_GT(eight.duplicated.flops, 0.0);
  }
  // The reference model likewise.
  const CostEstimate r1 = estimate(key(512, 256, 2, 1), &p, CostModel::kReference);
  const CostEstimate r8 = estimate(key(512, 256, 2, 8), &p, CostModel::kReference);
  expect_rel(r8.duplicated.seconds(), 8 * r1.duplicated.seconds(), "reference duplicated");
  expect_rel(r8.distributed.flops, 8 * r1.distributed.flops, "reference distributed");
}

TEST(BatchedCost, BatchedProductsPayTheirLaunchOncePerCall) {
  for (const bool rising : {false, true}) {
    const HardwareProfile p = calibrated(rising);
    const CostEstimate one = estimate(key(512, 256, 2, 1, true), &p, CostModel::kRefined);
    const CostEstimate batched = estimate(key(512, 256, 2, 8, true), &p, CostModel::kRefined);
    // Duplicated runs the gathered batch's NS as one batched call per product: at flat rates the
    // same time as 8 products, at rates that grow with size less (the launch paid once).
    if (rising) {
      EXPECT_LT(batched.duplicated.compute_s, 8 * one.duplicated.compute_s);
      EXPECT_LT(batched.duplicated_gram.compute_s, 8 * one.duplicated_gram.compute_s);
    } else {
      expect_rel(batched.duplicated.compute_s, 8 * one.duplicated.compute_s, "flat rates");
    }
    expect_rel(batched.duplicated.flops, 8 * one.duplicated.flops, "the same FLOPs");
    // Distributed runs one matrix after the other: 8 of everything.
    expect_rel(batched.duplicated.latency_s, one.duplicated.latency_s, "one gather");
    expect_rel(batched.distributed.compute_s, 8 * one.distributed.compute_s, "distributed");
    expect_rel(batched.distributed.latency_s, 8 * one.distributed.latency_s, "distributed");
  }
  // Without a calibration (datasheet peak, no launch term) batching changes nothing.
  HardwareProfile peak = calibrated(true);
  peak.calibration.reset();
  const CostEstimate one = estimate(key(512, 256, 2, 1, true), &peak, CostModel::kRefined);
  const CostEstimate batched = estimate(key(512, 256, 2, 8, true), &peak, CostModel::kRefined);
  expect_rel(batched.duplicated.compute_s, 8 * one.duplicated.compute_s, "peak");
}

TEST(BatchedCost, OwnersAndHomesTakeTheMatricesOneByOneByLpt) {
  const HardwareProfile p = calibrated(true);
  // One batched key of 8 and one weight of another shape, against the same as 9 separate keys.
  const std::vector<AutoKey> batched = {key(512, 256, 2, 8), key(256, 256, 2, 1)};
  std::vector<AutoKey> separate(8, key(512, 256, 2, 1));
  separate.push_back(key(256, 256, 2, 1));
  for (const HardwareProfile* prof : {static_cast<const HardwareProfile*>(nullptr), &p}) {
    std::vector<CostEstimate> eb, es;
    for (const AutoKey& k : batched)
      eb.push_back(estimate(k, prof, CostModel::kRefined));
    for (const AutoKey& k : separate)
      es.push_back(estimate(k, prof, CostModel::kRefined));
    const OwnerBucketEstimate b = estimate_owner_bucket(batched, eb, prof, {4, {}});
    const OwnerBucketEstimate s = estimate_owner_bucket(separate, es, prof, {4, {}});
    ASSERT_EQ(b.owners.size(), 9u);      // per matrix
    EXPECT_EQ(b.algorithms.size(), 2u);  // per key
    EXPECT_EQ(b.owners, s.owners);
    EXPECT_EQ(std::count(b.owners.begin(), b.owners.begin() + 8, 0), 4);  // 4 experts each
    expect_rel(b.compute, s.compute, "busiest owner");
    expect_rel(b.cost(), s.cost(), "the bucket");
    expect_rel(b.payload_bytes, s.payload_bytes, "bytes");
    // The homes of the same weights unsharded over 2 replicas.
    std::vector<AutoKey> ub = batched, us = separate;
    for (AutoKey& k : ub)
      k.group_size = 1;
    for (AutoKey& k : us)
      k.group_size = 1;
    const ReplicaBucketEstimate hb =
        estimate_replica_bucket(ub, 2, false, prof, CostModel::kRefined, 4.0, {4, {}});
    const ReplicaBucketEstimate hs =
        estimate_replica_bucket(us, 2, false, prof, CostModel::kRefined, 4.0, {4, {}});
    ASSERT_EQ(hb.homes.size(), 9u);
    EXPECT_EQ(hb.homes, hs.homes);
    EXPECT_EQ(std::count(hb.homes.begin(), hb.homes.begin() + 8, 1), 4);
    expect_rel(hb.every_rank, hs.every_rank, "every rank");
    expect_rel(hb.compute, hs.compute, "busiest home");
    expect_rel(hb.home_cost(), hs.home_cost(), "homes");
  }
}

TEST(BatchedCost, AutoPricesOwnerOnThePipelinedSchedule) {
  const HardwareProfile p = calibrated(true);
  const std::vector<AutoKey> keys = {key(512, 256, 2, 8), key(768, 256, 2, 1), key(256, 256, 2, 1)};
  std::vector<CostEstimate> es;
  for (const AutoKey& k : keys)
    es.push_back(estimate(k, &p, CostModel::kRefined));
  const BucketPlan plan = plan_bucket(keys, &p, CostModel::kRefined);
  ASSERT_TRUE(plan.owner.has_value());
  // The optimizer's schedule: the cost model's chunk count (test_chunk_choice), here pipelined.
  const OwnerBucketEstimate pipelined = estimate_owner_bucket(keys, es, &p, {kChosenChunks, {}});
  EXPECT_GT(pipelined.chunks, 1);
  EXPECT_EQ(plan.owner->chunks, pipelined.chunks);
  EXPECT_EQ(plan.owner->seconds, pipelined.seconds);
  EXPECT_EQ(pipelined.seconds, estimate_owner_bucket(keys, es, &p, {pipelined.chunks, {}}).seconds);
  EXPECT_LT(pipelined.seconds, estimate_owner_bucket(keys, es, &p, {1, {}}).seconds);
  EXPECT_EQ(plan.choices.size(), keys.size());  // one choice per parameter
  // plan --replicas prices the homes on the same schedule.
  PlanOptions o;
  o.group_size = 2;
  o.elem_size = 4;
  o.replicas = 2;
  o.profile = p;
  const Plan replicated = make_plan({{"w", 512, 256, 8, false}, {"v", 256, 256, 3, false}}, o);
  ASSERT_TRUE(replicated.replicated.has_value());
  // Its chunks: the homes' estimate's choice on plan's keys (each weight unsharded).
  std::vector<AutoKey> unsharded;
  for (const auto& [m, n, count] : {std::tuple<Index, Index, int>{512, 256, 8}, {256, 256, 3}}) {
    AutoKey k = o.key(m, n, 1);
    k.group_size = 1;
    k.second_group_size = 1;
    k.partition_dim = 0;
    k.crosses_domain = false;
    unsharded.insert(unsharded.end(), static_cast<std::size_t>(count), k);
  }
  EXPECT_EQ(replicated.replicated->chunks,
            estimate_replica_bucket(unsharded, 2, false, &p, CostModel::kRefined, 4.0,
                                    {kChosenChunks, {}})
                .chunks);
  EXPECT_GT(replicated.replicated->chunks, 1);
}

TEST(BatchedCost, PlanCountsABatchedWeightOncePerParameter) {
  ModelPreset m;
  m.name = "moe";
  m.hidden = 256;
  m.ffn = 512;
  m.heads = 4;
  m.kv_heads = 4;
  m.layers = 2;
  m.vocab = 256;
  m.moe = MoeConfig{.experts = 8, .expert_ffn = 256};
  const std::vector<WeightShape> ws = muon_weights(m);
  const auto fc1 = std::find_if(ws.begin(), ws.end(),
                                [](const WeightShape& w) { return w.name == "expert.fc1"; });
  ASSERT_NE(fc1, ws.end());
  EXPECT_EQ(fc1->batch, 8);
  EXPECT_EQ(fc1->count, 16);
  PlanOptions o;
  o.group_size = 2;
  o.elem_size = 4;
  const Plan plan = make_plan(ws, o);
  double duplicated = 0;
  bool found = false;
  for (const PlanRow& r : plan.rows) {
    duplicated += r.weights() * r.estimate.cost(TpMode::kDuplicated);
    if (r.m == 512 && r.n == 256) {
      found = true;
      EXPECT_EQ(r.batch, 8);
      EXPECT_EQ(r.weights(), 2.0);
      expect_rel(r.estimate.duplicated.flops,
                 8 * estimate(o.key(512, 256), nullptr, CostModel::kRefined).duplicated.flops,
                 "a batched row's FLOPs");
    }
  }
  EXPECT_TRUE(found);
  expect_rel(plan.total_duplicated, duplicated, "total");
}

}  // namespace
}  // namespace distmuon
