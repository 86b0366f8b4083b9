// Both cost models on hand-computed cases. Expected values are written out from the equations
// of docs/cost-model.md with powers of two, so they are exact in double (tolerance: relative
// 1e-12, only for the divisions by peak and bandwidth).
#include <gtest/gtest.h>

#include <cmath>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "expect_rel.h"

namespace distmuon {
namespace {

constexpr double kGi = 1024.0 * 1024.0 * 1024.0;  // 2^30
constexpr double kMi = 1024.0 * 1024.0;           // 2^20

AutoKey key(Index m, Index n, int g, bool syrk = true, bool crosses = false, int elem = 2) {
  return AutoKey{.m = m,
                 .n = n,
                 .group_size = g,
                 .crosses_domain = crosses,
                 .steps = 5,
                 .use_syrk = syrk,
                 .elem_size = elem};
}

// A profile with round numbers: 600 TFLOP/s bf16, 100 GB/s inside, 10 GB/s across, no latency.
HardwareProfile test_profile(double intra_lat_us = 0, double inter_lat_us = 0) {
  HardwareProfile p;
  p.name = "test";
  p.peak_tflops_bf16 = 600;
  p.peak_tflops_fp32 = 300;
  p.intra_domain_gbps = 100;
  p.inter_domain_gbps = 10;
  p.intra_domain_latency_us = intra_lat_us;
  p.inter_domain_latency_us = inter_lat_us;
  p.domain_size = 8;
  p.source = "test";
  return p;
}

using test::expect_rel;

// Tall 4096 x 1024, G = 8, 5 steps, syrk: s = 1024 = 2^10, L = 2^12, k = 512.
// duplicated = 5 (2^32 + 2^30 + 2^33) = 65 Gi; distributed = 5 (2^29 + 2^30 + 2^30) = 12.5 Gi.
TEST(ReferenceModel, TallWithoutProfilePrefersDistributed) {
  const CostEstimate e = estimate_reference(key(4096, 1024, 8), nullptr);
  EXPECT_EQ(e.duplicated.flops, 65 * kGi);
  EXPECT_EQ(e.distributed.flops, 12.5 * kGi);
  EXPECT_FALSE(e.has_profile);
  EXPECT_EQ(e.cost(TpMode::kDistributed),
            e.distributed.flops);  // without a profile, costs are FLOPs
  EXPECT_EQ(e.choice, TpMode::kDistributed);
}

// Wide 1024 x 4096: the Gram is forced onto n = 4096 with k = 128:
// distributed = 5 (2^31 + 2^36 + 2^32) = 350 Gi against duplicated 65 Gi.
TEST(ReferenceModel, WideWithoutProfilePrefersDuplicated) {
  const CostEstimate e = estimate_reference(key(1024, 4096, 8), nullptr);
  EXPECT_EQ(e.duplicated.flops, 65 * kGi);
  EXPECT_EQ(e.distributed.flops, 350 * kGi);
  EXPECT_EQ(e.choice, TpMode::kDuplicated);
}

TEST(ReferenceModel, CrossingDomainWithoutProfileGivesDuplicated) {
  const CostEstimate e = estimate_reference(key(4096, 1024, 8, true, /*crosses=*/true), nullptr);
  EXPECT_LT(e.distributed.flops, e.duplicated.flops);
  EXPECT_EQ(e.choice, TpMode::kDuplicated);
}

TEST(ReferenceModel, TieGivesDuplicated) {
  // G = 1: k = m, both modes run the same NS of a tall matrix along n.
  const CostEstimate e = estimate_reference(key(4096, 1024, 1), nullptr);
  EXPECT_EQ(e.duplicated.flops, e.distributed.flops);
  EXPECT_EQ(e.choice, TpMode::kDuplicated);
}

// With the test profile and e = 2, r = 7/8:
//  bytes duplicated = 2^22 * 2 * 7/8 = 7 Mi; distributed = 5 * 2 * 2^20 * 2 * 7/8 = 17.5 Mi.
//  syrk: FLOPs 65 Gi vs 12.5 Gi; gemm: 5 (2 (2^32 + 2^30) + 2^33) = 90 Gi vs 5 (2 (2^29 + 2^30) +
//  2^30) = 20 Gi. Distributed saves 52.5 Gi / 600e12 = 93.8 us of compute with syrk, 70 Gi / 600e12
//  = 125.3 us with gemm, and costs 10.5 Mi / 100e9 = 110.1 us more traffic: syrk flips the
//  decision.
TEST(ReferenceModel, SyrkFlipsTheDecision) {
  const HardwareProfile p = test_profile();
  const CostEstimate with_syrk = estimate_reference(key(4096, 1024, 8, true), &p);
  const CostEstimate with_gemm = estimate_reference(key(4096, 1024, 8, false), &p);
  expect_rel(with_syrk.duplicated.wire_bytes, 7 * kMi);
  expect_rel(with_syrk.distributed.wire_bytes, 17.5 * kMi);
  expect_rel(with_syrk.duplicated.seconds(), 65 * kGi / 600e12 + 7 * kMi / 100e9);
  expect_rel(with_syrk.distributed.seconds(), 12.5 * kGi / 600e12 + 17.5 * kMi / 100e9);
  expect_rel(with_gemm.duplicated.seconds(), 90 * kGi / 600e12 + 7 * kMi / 100e9);
  expect_rel(with_gemm.distributed.seconds(), 20 * kGi / 600e12 + 17.5 * kMi / 100e9);
  EXPECT_EQ(with_syrk.choice, TpMode::kDuplicated);
  EXPECT_EQ(with_gemm.choice, TpMode::kDistributed);
  EXPECT_EQ(with_syrk.cost(TpMode::kDuplicated), with_syrk.duplicated.seconds());
}

TEST(ReferenceModel, CrossingDomainUsesTheInterDomainBandwidth) {
  const HardwareProfile p = test_profile();
  const CostEstimate e = estimate_reference(key(4096, 1024, 8, false, /*crosses=*/true), &p);
  expect_rel(e.duplicated.bandwidth_s, 7 * kMi / 10e9);
  expect_rel(e.distributed.bandwidth_s, 17.5 * kMi / 10e9);
  EXPECT_EQ(e.choice, TpMode::kDuplicated);  // 10x dearer traffic outweighs the 125 us saved
}

TEST(ReferenceModel, Fp32UsesTheFp32Peak) {
  const HardwareProfile p = test_profile();
  const CostEstimate e = estimate_reference(key(4096, 1024, 8, true, false, 4), &p);
  expect_rel(e.duplicated.compute_s, 65 * kGi / 300e12);
  expect_rel(e.duplicated.wire_bytes, 14 * kMi);
}

// Refined, rows split (dim 0), no profile: the same FLOPs as the reference for a divisible tall
// shape, plus the norm all-reduce in the byte count.
TEST(RefinedModel, RowsSplitMatchesReferenceFlopsAndCountsTheNorm) {
  const CostEstimate e = estimate_refined(key(4096, 1024, 8), nullptr);
  EXPECT_EQ(e.duplicated.flops, 65 * kGi);
  EXPECT_EQ(e.distributed.flops, 12.5 * kGi);
  EXPECT_EQ(e.duplicated.payload_bytes, 4096.0 * 1024 * 2);  // one all-gather of the m x n matrix
  EXPECT_EQ(e.duplicated.all_gathers, 1);
  EXPECT_EQ(e.distributed.payload_bytes, 8 + 5 * kMi * 2);  // norm (a double) + 5 Gram all-reduces
  EXPECT_EQ(e.distributed.all_reduces, 6);
  EXPECT_EQ(e.choice, TpMode::kDistributed);
}

// Columns split (dim 1) of a wide 1024 x 4096: the Gram is on m = 1024, k = 4096 / 8 = 512:
// 5 (2^29 + 2^30 + 2^30) = 12.5 Gi, where the reference forces the Gram onto n (350 Gi).
TEST(RefinedModel, ColumnsSplitPutsTheGramOnM) {
  AutoKey k = key(1024, 4096, 8);
  k.partition_dim = 1;
  const CostEstimate e = estimate_refined(k, nullptr);
  EXPECT_EQ(e.distributed.flops, 12.5 * kGi);
  EXPECT_EQ(e.distributed.payload_bytes, 8 + 5 * kMi * 2);
  EXPECT_EQ(e.choice, TpMode::kDistributed);
  EXPECT_EQ(estimate_reference(k, nullptr).choice, TpMode::kDuplicated);
}

// Latency: all-gather (G - 1) alpha, all-reduce 2 (G - 1) alpha, distributed runs S + 1 of them.
TEST(RefinedModel, AddsRingLatencies) {
  const HardwareProfile p = test_profile(4, 20);
  const CostEstimate intra = estimate_refined(key(4096, 1024, 8), &p);
  expect_rel(intra.duplicated.latency_s, 7 * 4e-6);
  expect_rel(intra.distributed.latency_s, 6 * 2 * 7 * 4e-6);
  expect_rel(intra.distributed.bandwidth_s, (2 * 8 + 5 * 2 * 2 * kMi) * 7 / 8 / 100e9);
  expect_rel(intra.distributed.seconds(),
             12.5 * kGi / 600e12 + (2 * 8 + 5 * 2 * 2 * kMi) * 7 / 8 / 100e9 + 6 * 2 * 7 * 4e-6);
  const CostEstimate cross = estimate_refined(key(4096, 1024, 8, true, true), &p);
  expect_rel(cross.distributed.latency_s, 6 * 2 * 7 * 20e-6);
}

// Latency can flip a decision the bandwidth-only reference makes: a small tall weight.
TEST(RefinedModel, LatencyFlipsSmallWeightsToDuplicated) {
  const HardwareProfile p = test_profile(20, 20);
  const AutoKey k = key(8192, 128, 8, false);  // ~23 us vs ~3.5 us by bandwidth; 7 vs 84 ring steps
  EXPECT_EQ(estimate_reference(k, &p).choice, TpMode::kDistributed);
  EXPECT_EQ(estimate_refined(k, &p).choice, TpMode::kDuplicated);
}

// Two-step TP x GTP (G = 4 over rows, G2 = 2 gathered first), 4096 x 1024, e = 2:
// first all-gather payload 2^22 * 2 / 4 = 2 Mi (wire half of it), then duplicated gathers the
// whole 8 Mi over 4 (wire 3/4); distributed runs over 4 with k = 1024 = s: 5 (2^30 + 2^30 + 2^31).
TEST(RefinedModel, TwoStepGathersTheSmallerGroupFirst) {
  AutoKey k = key(4096, 1024, 4);
  k.second_group_size = 2;
  const CostEstimate e = estimate_refined(k, nullptr);
  EXPECT_EQ(e.duplicated.payload_bytes, 2 * kMi + 8 * kMi);
  EXPECT_EQ(e.duplicated.wire_bytes, 1 * kMi + 6 * kMi);
  EXPECT_EQ(e.duplicated.all_gathers, 2);
  EXPECT_EQ(e.distributed.all_gathers, 1);
  EXPECT_EQ(e.distributed.payload_bytes, 2 * kMi + 8 + 5 * 2 * kMi);
  EXPECT_EQ(e.distributed.flops, 20 * kGi);
  EXPECT_EQ(e.duplicated.flops, 65 * kGi);
}

TEST(RefinedModel, PadsShardsThatDoNotDivide) {
  const CostEstimate e = estimate_refined(key(1001, 64, 8), nullptr);  // k = 126, 1008 padded rows
  EXPECT_EQ(e.duplicated.payload_bytes, 1008.0 * 64 * 2);
  EXPECT_EQ(e.distributed.flops, 5 * (126.0 * 64 * 64 + 64.0 * 64 * 64 + 2 * 126.0 * 64 * 64));
}

TEST(RefinedModel, MeshBandwidthGrowsWithTheGroup) {
  HardwareProfile p = test_profile();
  p.intra_domain_gbps = 448;
  p.intra_domain_peer_gbps = 64;
  EXPECT_EQ(p.bandwidth_gbps(2, false), 64);
  EXPECT_EQ(p.bandwidth_gbps(4, false), 192);
  EXPECT_EQ(p.bandwidth_gbps(8, false), 448);
  EXPECT_EQ(p.bandwidth_gbps(16, false), 448);
  EXPECT_EQ(p.bandwidth_gbps(4, true), 10);
  const CostEstimate e = estimate_refined(key(4096, 1024, 4), &p);
  expect_rel(e.duplicated.bandwidth_s, 8 * kMi * 3 / 4 / 192e9);
}

TEST(CostModel, InvalidKeysAndNamesAreRejected) {
  EXPECT_THROW(estimate_refined(key(0, 16, 2), nullptr), Error);
  AutoKey k = key(16, 16, 2);
  k.partition_dim = 2;
  EXPECT_THROW(estimate_reference(k, nullptr), Error);
  k = key(16, 16, 2);
  k.steps = 0;
  EXPECT_THROW(estimate_refined(k, nullptr), Error);
  const HardwareProfile p = test_profile();
  EXPECT_THROW(estimate_refined(key(16, 16, 2, true, false, 8), &p), Error);  // no fp64 peak
  EXPECT_EQ(parse_cost_model("reference"), CostModel::kReference);
  try {
    parse_cost_model("fast");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refined, reference"), std::string::npos);
  }
}

TEST(CostModel, DescribesKeysAndCosts) {
  EXPECT_EQ(describe(key(4096, 1024, 8)), "4096x1024 G=8 intra-domain");
  AutoKey k = key(4096, 1024, 4, true, true);
  k.partition_dim = 1;
  k.second_group_size = 2;
  EXPECT_EQ(describe(k), "4096x1024 G=4 dim=1 G2=2 cross-domain");
  EXPECT_EQ(format_cost(1.92e-3, true), "1.92 ms");
  EXPECT_EQ(format_cost(7.1e-4, true), "710.00 us");
  EXPECT_EQ(format_cost(2.5, true), "2.50 s");
  EXPECT_EQ(format_cost(3.41e9, false), "3.41 GFLOP");
}

}  // namespace
}  // namespace distmuon
