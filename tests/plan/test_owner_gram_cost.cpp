// The refined model's Gram and owner candidates: the Gram algorithm's all-reduce count, which
// algorithm a key allows, auto's choice of the cheaper, plan_bucket's owner decision in a case
// built for each outcome, the reference model's two candidates, and the owners of a bucket
// estimate (LPT on the FLOPs). Costs are compared as the model computes them (no tolerance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/hardware_profile.h"

namespace distmuon {
namespace {

AutoKey key(Index m, Index n, int g, NsAlgorithm algorithm = NsAlgorithm::kAuto, int dim = 0,
            bool crosses = false, int formations = 1) {
  return AutoKey{.m = m,
                 .n = n,
                 .group_size = g,
                 .partition_dim = dim,
                 .crosses_domain = crosses,
                 .steps = 5,
                 .use_syrk = true,
                 .elem_size = 4,
                 .algorithm = algorithm,
                 .gram_formations = formations};
}

// Round figures: 300 TFLOP/s fp32, 100 GB/s inside a domain and `inter_gbps` across, latencies
// in microseconds.
HardwareProfile profile(double inter_gbps = 10, double intra_lat_us = 5, double inter_lat_us = 20) {
  HardwareProfile p;
  p.name = "test";
  p.peak_tflops_bf16 = 600;
  p.peak_tflops_fp32 = 300;
  p.intra_domain_gbps = 100;
  p.inter_domain_gbps = inter_gbps;
  p.intra_domain_latency_us = intra_lat_us;
  p.inter_domain_latency_us = inter_lat_us;
  p.domain_size = 8;
  p.source = "test";
  return p;
}

// distributed + Gram: one norm all-reduce and one all-reduce per Gram formation (1 + restarts)
// of s x s elements; standard: one per step.
TEST(GramCost, DistributedGramAllReducesOncePlusRestarts) {
  const HardwareProfile p = profile();
  for (const HardwareProfile* prof : {static_cast<const HardwareProfile*>(nullptr), &p}) {
    for (int restart : {0, 1, 2, 4}) {
      for (int dim : {0, 1}) {
        NsOptions o;  // quintic, 5 steps: automatic restarts (0) form one Gram matrix
        o.algorithm = NsAlgorithm::kGram;
        o.gram_restart = restart;
        const int grams = gram_ns_gram_count(o);
        EXPECT_EQ(grams, 1 + (restart > 0 ? (o.steps - 1) / restart : 0));
        const AutoKey k = key(4096, 1024, 8, NsAlgorithm::kAuto, dim, false, grams);
        const CostEstimate e = estimate_refined(k, prof);
        EXPECT_EQ(e.distributed_gram.all_reduces, 1 + grams) << "restart " << restart;
        EXPECT_EQ(e.distributed.all_reduces, 1 + k.steps);
        const double s = dim == 0 ? 1024 : 4096;
        EXPECT_DOUBLE_EQ(e.distributed_gram.payload_bytes, 8 + grams * s * s * 4);
        EXPECT_DOUBLE_EQ(e.distributed.payload_bytes, 8 + k.steps * s * s * 4);
        // Duplicated moves the same matrix with either algorithm.
        EXPECT_EQ(e.duplicated_gram.all_gathers, e.duplicated.all_gathers);
        EXPECT_DOUBLE_EQ(e.duplicated_gram.payload_bytes, e.duplicated.payload_bytes);
      }
    }
  }
}

struct Sweep {
  std::vector<AutoKey> keys;
  std::vector<const HardwareProfile*> profiles;
};

Sweep sweep(NsAlgorithm algorithm, const std::vector<HardwareProfile>& profiles) {
  Sweep s;
  const Index shapes[][2] = {{4096, 1024}, {1024, 4096}, {2048, 2048}, {256, 8192},
                             {8192, 256},  {64, 64},     {512, 128}};
  for (const auto& sh : shapes)
    for (int g : {2, 4, 8})
      for (int dim : {0, 1})
        for (bool crosses : {false, true})
          for (int formations : {1, 3})
            s.keys.push_back(key(sh[0], sh[1], g, algorithm, dim, crosses, formations));
  s.profiles.push_back(nullptr);
  for (const HardwareProfile& p : profiles)
    s.profiles.push_back(&p);
  return s;
}

std::vector<HardwareProfile> profiles() {
  std::vector<HardwareProfile> out = {profile(), profile(1, 50, 200)};
  if (auto h100 = find_profile("h100")) out.push_back(*h100);
  return out;
}

TEST(GramCost, PinnedAlgorithmIsAlwaysTheChoice) {
  const std::vector<HardwareProfile> ps = profiles();
  for (NsAlgorithm pinned : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    const Sweep s = sweep(pinned, ps);
    for (const HardwareProfile* p : s.profiles) {
      for (const AutoKey& k : s.keys) {
        const CostEstimate e = estimate_refined(k, p);
        EXPECT_EQ(e.algorithm, pinned) << describe(k);
        const BucketPlan b = plan_bucket(std::span<const AutoKey>(&k, 1), p, CostModel::kRefined);
        EXPECT_EQ(b.choices[0].algorithm, pinned) << describe(k);
      }
    }
  }
}

// kAuto: the choice is the cheapest of the four candidates (duplicated, distributed) x
// (standard, gram), distributed left out when a crossing group has no profile. Ties go to
// duplicated, then standard: the first of the list in that order.
TEST(GramCost, AutoPicksTheCheaperAlgorithm) {
  const std::vector<HardwareProfile> ps = profiles();
  const Sweep s = sweep(NsAlgorithm::kAuto, ps);
  int gram = 0, standard = 0;
  for (const HardwareProfile* p : s.profiles) {
    for (const AutoKey& k : s.keys) {
      const CostEstimate e = estimate_refined(k, p);
      AutoChoice best;
      double best_cost = std::numeric_limits<double>::infinity();
      for (TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed}) {
        if (p == nullptr && k.crosses_domain && mode == TpMode::kDistributed) continue;
        for (NsAlgorithm a : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
          if (e.cost(mode, a) < best_cost) {
            best_cost = e.cost(mode, a);
            best = {mode, a};
          }
        }
      }
      EXPECT_EQ(e.best(), best) << describe(k) << (p ? " profile " + p->name : " no profile");
      (e.algorithm == NsAlgorithm::kGram ? gram : standard)++;
    }
  }
  std::printf("  auto over %zu keys x %zu profiles: gram %d, standard %d\n", s.keys.size(),
              s.profiles.size(), gram, standard);
  // Both outcomes occur: else the sweep would not test the choice.
  EXPECT_GT(gram, 0);
  EXPECT_GT(standard, 0);
}

void print_bucket(const char* what, const BucketPlan& b) {
  std::printf("  %s: owner %.4g, per-weight %.4g -> %s\n", what, b.owner ? b.owner->cost() : -1.0,
              b.per_weight_cost, b.chose_owner() ? "owner" : to_string(b.choices[0]).c_str());
}

// Many equal small weights on 2 ranks with latency-bound collectives: per weight, duplicated
// all-gathers once and runs the whole NS on both ranks, distributed all-reduces every step;
// owner halves the NS work per rank and runs two all-to-alls for the whole bucket.
TEST(OwnerCost, ManyEqualWeightsPickOwner) {
  const HardwareProfile p = profile();
  const std::vector<AutoKey> keys(16, key(256, 256, 2));
  const BucketPlan b = plan_bucket(keys, &p, CostModel::kRefined);
  print_bucket("16 x 256x256 on 2", b);
  ASSERT_TRUE(b.owner.has_value());
  EXPECT_LT(b.owner->cost(), b.per_weight_cost);
  ASSERT_TRUE(b.chose_owner());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(b.choices[i].mode, TpMode::kOwner);
    EXPECT_EQ(b.choices[i].algorithm, b.owner->algorithms[i]);
  }
  // Equal weights split evenly: 8 per owner.
  EXPECT_EQ(std::count(b.owner->owners.begin(), b.owner->owners.end(), 0), 8);
}

// One weight across a slow domain boundary: owner runs the same full NS as duplicated on one rank
// but moves the matrix twice (in and out) where duplicated all-gathers it once.
TEST(OwnerCost, OneWeightAcrossASlowLinkKeepsThePerWeightChoice) {
  const HardwareProfile p = profile(1, 50, 200);
  const AutoKey k = key(4096, 4096, 2, NsAlgorithm::kAuto, 0, true);
  const BucketPlan b = plan_bucket(std::span<const AutoKey>(&k, 1), &p, CostModel::kRefined);
  print_bucket("1 x 4096x4096 on 2 cross-domain", b);
  ASSERT_TRUE(b.owner.has_value());
  EXPECT_GE(b.owner->cost(), b.per_weight_cost);
  EXPECT_FALSE(b.chose_owner());
  EXPECT_EQ(b.choices[0], estimate_refined(k, &p).best());
}

// Whatever the case, plan_bucket takes owner exactly when its estimate is below the per-weight
// sum, and then for every weight.
TEST(OwnerCost, OwnerExactlyWhenCheaper) {
  const std::vector<HardwareProfile> ps = profiles();
  int owners = 0, others = 0;
  for (const HardwareProfile& p : ps) {
    for (int count : {1, 2, 3, 8}) {
      for (Index m : {128, 1024, 4096}) {
        for (int g : {2, 4}) {
          for (bool crosses : {false, true}) {
            const std::vector<AutoKey> keys(static_cast<std::size_t>(count),
                                            key(m, 1024, g, NsAlgorithm::kAuto, 0, crosses));
            const BucketPlan b = plan_bucket(keys, &p, CostModel::kRefined);
            ASSERT_TRUE(b.owner.has_value());
            const bool cheaper = b.owner->cost() < b.per_weight_cost;
            EXPECT_EQ(b.chose_owner(), cheaper);
            double sum = 0;
            for (const AutoKey& k : keys)
              sum += estimate_refined(k, &p).best_cost();
            EXPECT_DOUBLE_EQ(b.per_weight_cost, sum);
            for (const AutoChoice& c : b.choices)
              EXPECT_EQ(c.mode == TpMode::kOwner, cheaper);
            (cheaper ? owners : others)++;
          }
        }
      }
    }
  }
  std::printf("  buckets: owner %d, per-weight %d\n", owners, others);
  EXPECT_GT(owners, 0);
  EXPECT_GT(others, 0);
}

// The reference model keeps its two candidates: no owner estimate, no Gram, in any bucket.
TEST(OwnerCost, ReferenceModelNeverPicksOwnerOrGram) {
  const std::vector<HardwareProfile> ps = profiles();
  const Sweep s = sweep(NsAlgorithm::kAuto, ps);
  for (const HardwareProfile* p : s.profiles) {
    for (const AutoKey& k : s.keys) {
      const std::vector<AutoKey> keys(16, k);  // the bucket owner wins under the refined model
      const BucketPlan b = plan_bucket(keys, p, CostModel::kReference);
      EXPECT_FALSE(b.owner.has_value());
      for (const AutoChoice& c : b.choices) {
        EXPECT_NE(c.mode, TpMode::kOwner) << describe(k);
        EXPECT_EQ(c.algorithm, NsAlgorithm::kStandard) << describe(k);
      }
      EXPECT_FALSE(estimate_reference(k, p).prices_gram);
    }
  }
}

// The owners of a bucket estimate are LPT on each weight's owner FLOPs (with the algorithm the
// estimate picked for it), as the executor assigns them.
TEST(OwnerCost, BucketOwnersAreLptOnTheFlops) {
  const HardwareProfile p = profile();
  std::vector<AutoKey> keys;
  for (Index m : {4096, 512, 2048, 512, 1024, 4096, 256})
    keys.push_back(key(m, 1024, 4));
  for (const HardwareProfile* prof : {static_cast<const HardwareProfile*>(nullptr), &p}) {
    std::vector<CostEstimate> est;
    for (const AutoKey& k : keys)
      est.push_back(estimate_refined(k, prof));
    const OwnerBucketEstimate o = estimate_owner_bucket(keys, est, prof);
    std::vector<double> flops;
    for (std::size_t i = 0; i < keys.size(); ++i)
      flops.push_back(est[i].of(TpMode::kOwner, o.algorithms[i]).flops);
    EXPECT_EQ(o.owners, lpt_assign(flops, 4));
    // The compute term is the busiest owner's load.
    std::vector<double> load(4, 0);
    for (std::size_t i = 0; i < keys.size(); ++i)
      load[static_cast<std::size_t>(o.owners[i])] += est[i].cost(TpMode::kOwner, o.algorithms[i]);
    EXPECT_DOUBLE_EQ(o.compute, *std::max_element(load.begin(), load.end()));
  }
  // Keys of different groups cannot share a bucket; the reference model's estimates cannot price
  // owner.
  std::vector<AutoKey> mixed = {key(512, 512, 2), key(512, 512, 4)};
  std::vector<CostEstimate> est = {estimate_refined(mixed[0], &p), estimate_refined(mixed[1], &p)};
  EXPECT_THROW(estimate_owner_bucket(mixed, est, &p), Error);
  mixed[1] = mixed[0];
  est[1] = estimate_reference(mixed[1], &p);
  EXPECT_THROW(estimate_owner_bucket(mixed, est, &p), Error);
}

}  // namespace
}  // namespace distmuon
