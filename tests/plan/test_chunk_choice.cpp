// The chunk count of a pipelined bucket (ExchangeSchedule kChosenChunks): the cheapest of 1, 2, 4
// and 8 chunks (each capped at the bucket's matrices) on the schedule the estimate plays, ties to
// the fewer; the count the optimizer runs (src/optim/muon_chunks.cpp). A latency-bound bucket of
// tiny weights runs in one chunk, a bucket whose exchanges take about as long as its NS over a
// slow link in more, and the choice is never priced above the fixed 4 chunks. Pure functions, no
// timing; the seconds compared are the estimate's own, so equal means bit-equal.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <vector>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/hardware_profile.h"
#include "plan/exchange_schedule.h"

namespace distmuon {
namespace {

// A weight auto may give either algorithm (steps 5, syrk, fp32: AutoKey's defaults).
AutoKey chunk_key(Index m, Index n, int g) {
  return AutoKey{.m = m, .n = n, .group_size = g, .algorithm = NsAlgorithm::kAuto};
}

std::vector<CostEstimate> estimates_of(const std::vector<AutoKey>& keys, const HardwareProfile& p) {
  std::vector<CostEstimate> out;
  for (const AutoKey& k : keys)
    out.push_back(estimate(k, &p, CostModel::kRefined));
  return out;
}

OwnerBucketEstimate bucket(const std::vector<AutoKey>& keys, const HardwareProfile& p, int chunks,
                           LinkModel link = {}) {
  return estimate_owner_bucket(keys, estimates_of(keys, p), &p, {chunks, link});
}

HardwareProfile h100() {
  const std::optional<HardwareProfile> p = resolve_profile("h100");
  if (!p) throw Error("no h100 profile");
  return *p;
}

// A CPU-like profile: 0.2 TFLOP/s, 10 GB/s, 5 us a step.
HardwareProfile slow_compute() {
  HardwareProfile p = h100();
  p.name = "slow";
  p.peak_tflops_bf16 = p.peak_tflops_fp32 = 0.2;
  p.intra_domain_gbps = p.inter_domain_gbps = 10;
  p.intra_domain_latency_us = p.inter_domain_latency_us = 5;
  return p;
}

TEST(ChunkChoice, CheapestCandidateTiesToFewerChunksCappedAtTheMatrices) {
  std::vector<int> priced;
  auto table = [&](std::map<int, double> t) {
    return [&priced, t](int c) {
      priced.push_back(c);
      return t.at(c);
    };
  };
  const detail::ChunkChoice a =
      detail::cheapest_chunks(16, table({{1, 3}, {2, 2}, {4, 2}, {8, 5}}));
  EXPECT_EQ(a.chunks, 2);  // 4 ties with 2: the fewer
  EXPECT_EQ(a.seconds, 2);
  EXPECT_EQ(priced, (std::vector<int>{1, 2, 4, 8}));
  priced.clear();
  // 3 matrices: 4 and 8 chunks are 3 (the executor makes no empty chunk), priced once.
  EXPECT_EQ(detail::cheapest_chunks(3, table({{1, 3}, {2, 2}, {3, 1}})).chunks, 3);
  EXPECT_EQ(priced, (std::vector<int>{1, 2, 3}));
  priced.clear();
  EXPECT_EQ(detail::cheapest_chunks(0, table({{1, 7}})).chunks, 1);
  EXPECT_EQ(priced, (std::vector<int>{1}));
  EXPECT_EQ(detail::unpriced_chunks(kChosenChunks, 16), kUnpricedChunks);
  EXPECT_EQ(detail::unpriced_chunks(kChosenChunks, 2), 2);
  EXPECT_EQ(detail::unpriced_chunks(6, 16), 6);
  EXPECT_THROW(detail::unpriced_chunks(-1, 16), Error);
}

// Eight 64x32 weights over 2 ranks on the h100 profile: each chunk's two exchanges cost a
// latency and move almost nothing, so one chunk is cheapest, and with it owner beats the
// per-weight modes (with the fixed 4 chunks it did not: 27.31 against 27.29 us).
TEST(ChunkChoice, LatencyBoundBucketOfTinyWeightsRunsInOneChunk) {
  const HardwareProfile p = h100();
  const std::vector<AutoKey> keys(8, chunk_key(64, 32, 2));
  const OwnerBucketEstimate chosen = bucket(keys, p, kChosenChunks);
  const OwnerBucketEstimate one = bucket(keys, p, 1), four = bucket(keys, p, 4);
  std::printf("  8 x 64x32: chosen %d chunks %.3f us; 1 chunk %.3f us, 4 chunks %.3f us\n",
              chosen.chunks, chosen.seconds * 1e6, one.seconds * 1e6, four.seconds * 1e6);
  EXPECT_EQ(chosen.chunks, 1);
  EXPECT_EQ(chosen.seconds, one.seconds);
  EXPECT_LT(chosen.seconds, four.seconds);
  const BucketPlan plan = plan_bucket(keys, &p, CostModel::kRefined);  // the optimizer's schedule
  ASSERT_TRUE(plan.owner.has_value());
  EXPECT_EQ(plan.owner->chunks, 1);
  EXPECT_TRUE(plan.chose_owner()) << plan.owner->cost() << " vs " << plan.per_weight_cost;
  // The homes of replicated tiny weights: the same.
  const std::vector<AutoKey> unsharded(8, chunk_key(64, 32, 1));
  EXPECT_EQ(estimate_replica_bucket(unsharded, 2, false, &p, CostModel::kRefined, 4.0,
                                    {kChosenChunks, {}})
                .chunks,
            1);
}

// Twelve 1024x512 weights over 2 ranks, NS at 0.2 TFLOP/s, over a 0.24 GB/s link with 50 us
// latency: the exchanges take about as long as the NS, so the pipelined chunks hide them.
TEST(ChunkChoice, BandwidthHeavyBucketOverASlowLinkRunsInMoreChunks) {
  const HardwareProfile p = slow_compute();
  const std::vector<AutoKey> keys(12, chunk_key(1024, 512, 2));
  const LinkModel link{50e-6, 0.24e9};
  const OwnerBucketEstimate chosen = bucket(keys, p, kChosenChunks, link);
  const OwnerBucketEstimate one = bucket(keys, p, 1, link);
  std::printf("  12 x 1024x512 over the link: chosen %d chunks %.2f ms, serial %.2f ms (NS %.2f)\n",
              chosen.chunks, chosen.seconds * 1e3, one.seconds * 1e3, chosen.compute * 1e3);
  EXPECT_GT(chosen.chunks, 1);
  EXPECT_LT(chosen.seconds, one.seconds);
  EXPECT_EQ(chosen.seconds, bucket(keys, p, chosen.chunks, link).seconds);
}

// Whatever the bucket and the link: the chosen count's price is the estimate's on that count and
// never above the fixed 4 chunks' (nor the serial schedule's).
TEST(ChunkChoice, NeverPricedAboveFourChunks) {
  const HardwareProfile profiles[] = {h100(), slow_compute()};
  const LinkModel links[] = {{}, {50e-6, 0.24e9}, {5e-6, 10e9}};
  for (const HardwareProfile& p : profiles) {
    for (const LinkModel& link : links) {
      for (const auto& [m, n] : {std::pair<Index, Index>{64, 32}, {256, 256}, {1024, 512}}) {
        for (const std::size_t count : {1u, 3u, 8u, 16u}) {
          for (const int g : {2, 4}) {
            const std::string what =
                fmt::format("{} {}x{} x{} over {}, link {} us {} GB/s", p.name, m, n, count, g,
                            link.latency_s * 1e6, link.bytes_per_s / 1e9);
            const std::vector<AutoKey> keys(count, chunk_key(m, n, g));
            const OwnerBucketEstimate c = bucket(keys, p, kChosenChunks, link);
            EXPECT_LE(c.seconds, bucket(keys, p, 4, link).seconds) << what;
            EXPECT_LE(c.seconds, bucket(keys, p, 1, link).seconds) << what;
            EXPECT_EQ(c.seconds, bucket(keys, p, c.chunks, link).seconds) << what;
            const std::vector<AutoKey> unsharded(count, chunk_key(m, n, 1));
            auto homes = [&](int chunks) {
              return estimate_replica_bucket(unsharded, g, false, &p, CostModel::kRefined, 4.0,
                                             {chunks, link});
            };
            const ReplicaBucketEstimate r = homes(kChosenChunks);
            EXPECT_LE(r.seconds, homes(4).seconds) << what;
            EXPECT_EQ(r.seconds, homes(r.chunks).seconds) << what;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace distmuon
