// Owner mode: LPT owners, and owner = duplicated bit for bit (relative error exactly 0) through
// OwnerOrthogonalizer (src/tp/owner_ns.h), through the step's entry point WeightOrthogonalizer
// (src/tp/weight_orthogonalizer.h, every mode in one call) and through Muon, for every layout the
// optimizer supports, uneven buckets, ranks that own nothing and unsharded weights mixed in; its
// traffic per bucket.
//
// Tolerance 0: owner mode gathers the full matrix on one rank and runs orthogonalize_full on it,
// the code duplicated mode runs on the same gathered bits; the all-to-alls and all-gathers only
// copy. Any difference is a bug, not rounding.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string_view>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/hardware_profile.h"
#include "optim_test_util.h"
#include "tp/owner_ns.h"
#include "tp/sharded_ns.h"
#include "tp/weight_orthogonalizer.h"

namespace distmuon {
namespace {

using test::TestLayout;

// ---- LPT ---------------------------------------------------------------------------------------

double makespan(std::span<const double> costs, const std::vector<int>& bins, int ranks) {
  std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
  for (std::size_t i = 0; i < costs.size(); ++i)
    load[static_cast<std::size_t>(bins[i])] += costs[i];
  return *std::max_element(load.begin(), load.end());
}

// The optimum by trying every assignment (ranks^n of them).
double brute_force_optimum(const std::vector<double>& costs, int ranks) {
  std::vector<int> bins(costs.size(), 0);
  double best = makespan(costs, bins, ranks);
  while (true) {
    std::size_t i = 0;
    while (i < bins.size() && ++bins[i] == ranks)
      bins[i++] = 0;
    if (i == bins.size()) return best;
    best = std::min(best, makespan(costs, bins, ranks));
  }
}

TEST(Lpt, LargestFirstTiesToLowerIndexAndLowerBin) {
  EXPECT_EQ(lpt_assign(std::vector<double>{1, 1, 1, 1}, 2), (std::vector<int>{0, 1, 0, 1}));
  // 5 (item 1), 5 (item 2), 2 (item 0), 1 (item 3) over 3 bins: 1 -> 0, 2 -> 1, 0 -> 2, then
  // the least loaded is bin 2 (load 2).
  EXPECT_EQ(lpt_assign(std::vector<double>{2, 5, 5, 1}, 3), (std::vector<int>{2, 0, 1, 2}));
  EXPECT_EQ(lpt_assign(std::vector<double>{3, 3, 2}, 2), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(lpt_assign(std::vector<double>{4}, 4), (std::vector<int>{0}));  // 3 bins stay empty
  EXPECT_TRUE(lpt_assign(std::vector<double>{}, 2).empty());
  EXPECT_THROW(lpt_assign(std::vector<double>{1}, 0), Error);
}

TEST(Lpt, SameOnEveryCallAndEveryRank) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> cost(1, 9);  // small integers: many ties
  std::vector<double> costs(23);
  for (double& c : costs)
    c = cost(rng);
  const std::vector<int> a = lpt_assign(costs, 4);
  EXPECT_EQ(lpt_assign(costs, 4), a);
  const Communicator& w = test::world();
  std::vector<std::int32_t> all(a.size() * static_cast<std::size_t>(w.size()));
  const std::vector<std::int32_t> mine(a.begin(), a.end());
  w.all_gather<std::int32_t>(mine, all);
  for (std::size_t r = 0; r < static_cast<std::size_t>(w.size()); ++r)
    EXPECT_TRUE(std::equal(mine.begin(), mine.end(), all.begin() + r * a.size())) << "rank " << r;
}

// Graham's bound for LPT: makespan <= (4/3 - 1/(3 ranks)) OPT.
TEST(Lpt, MakespanWithinGrahamsBoundOfTheOptimum) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> cost(1, 20);
  for (int ranks : {2, 3}) {
    const double bound = 4.0 / 3.0 - 1.0 / (3.0 * ranks);
    for (std::size_t n = 1; n <= 7; ++n) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<double> costs(n);
        for (double& c : costs)
          c = cost(rng);
        const double lpt = makespan(costs, lpt_assign(costs, ranks), ranks);
        const double opt = brute_force_optimum(costs, ranks);
        EXPECT_GE(lpt, opt);
        EXPECT_LE(lpt, bound * opt + 1e-12) << "n " << n << " ranks " << ranks;
      }
    }
  }
  // The bound is reached: {3, 3, 2, 2, 2} on 2 bins gives 7 where 6 is optimal (7/6 = 4/3 - 1/6).
  const std::vector<double> tight = {3, 3, 2, 2, 2};
  EXPECT_EQ(makespan(tight, lpt_assign(tight, 2), 2), 7.0);
  EXPECT_EQ(brute_force_optimum(tight, 2), 6.0);
}

// ---- Cases -------------------------------------------------------------------------------------

struct Case {
  TestLayout l;
  bool expert = false;
};

// The process groups of each (TP, GTP) configuration, created once per run so that every weight
// of a configuration shares them (one bucket); each group counted.
struct Groups {
  struct Entry {
    explicit Entry(ProcessGroups groups) : pg(std::move(groups)) {
      pg.tp = counting_communicator(pg.tp, tp_stats);
      pg.gtp = counting_communicator(pg.gtp, gtp_stats);
    }
    std::shared_ptr<CommStats> tp_stats = std::make_shared<CommStats>();
    std::shared_ptr<CommStats> gtp_stats = std::make_shared<CommStats>();
    ProcessGroups pg;
  };
  std::map<std::pair<int, int>, Entry> map;
  Entry& get(const TestLayout& l) {
    auto it = map.find({l.tp, l.gtp});
    if (it == map.end())
      it = map.emplace(std::pair(l.tp, l.gtp), make_process_groups(test::world(), l.tp, l.gtp))
               .first;
    return it->second;
  }
  void reset() {
    for (auto& [k, e] : map) {
      e.tp_stats->reset();
      e.gtp_stats->reset();
    }
  }
};

// Every layout at world size w, grouped so that weights of one configuration share a bucket.
std::vector<Case> mixed_cases(int w) {
  std::vector<Case> out = {
      {{.label = "gtp tall", .m = 64, .n = 8, .gtp = w}},
      {{.label = "gtp wide", .m = 8 * w, .n = 64, .gtp = w}},
      {{.label = "gtp pad", .m = 16 * w - 3, .n = 4, .gtp = w, .pad = 3}},
      {{.label = "gtp qkv", .m = 48, .n = 8, .gtp = w, .qkv = {4, 2, 2}}},
      {{.label = "plain", .m = 16, .n = 24}},  // unsharded, between sharded ones
      {{.label = "tp dim0", .m = 48, .n = 8, .tp_dim = 0, .tp = w}},
      {{.label = "tp dim1", .m = 8, .n = 48, .tp_dim = 1, .tp = w}},
      {{.label = "tp dim0 qkv", .m = 16 * w, .n = 8, .tp_dim = 0, .tp = w, .qkv = {2, 1, 1}}},
  };
  if (w == 4) {
    out.push_back({{.label = "tp2 x gtp2 dim0", .m = 64, .n = 8, .tp_dim = 0, .tp = 2, .gtp = 2}});
    out.push_back({{.label = "tp2 x gtp2 dim1", .m = 64, .n = 8, .tp_dim = 1, .tp = 2, .gtp = 2}});
    out.push_back({{.label = "tp2 x gtp2 pad",
                    .m = 2 * 13,
                    .n = 6,
                    .tp_dim = 0,
                    .tp = 2,
                    .gtp = 2,
                    .pad = 3}});
  }
  // Expert weights on expert groups of 2 ranks (expert-parallel over the rest).
  const int eg = std::min(w, 2);
  out.push_back({{.label = "expert tall", .m = 64, .n = 8, .gtp = eg}, true});
  out.push_back({{.label = "expert wide", .m = 8, .n = 64, .gtp = eg}, true});
  return out;
}

// w + 1 weights of different sizes on w ranks (3 on 2, 5 on 4): some rank owns two.
std::vector<Case> uneven_cases(int w) {
  std::vector<Case> out;
  for (int i = 0; i <= w; ++i)
    out.push_back({{.label = "uneven " + std::to_string(i), .m = 16 * (i + 1), .n = 8, .gtp = w}});
  out.push_back({{.label = "plain", .m = 12, .n = 20}});
  return out;
}

// One weight on w ranks: w - 1 ranks own nothing.
std::vector<Case> single_case(int w) {
  return {{{.label = "alone", .m = 40, .n = 12, .gtp = w}}};
}

int expert_rank(const Case& c) {
  return c.expert ? test::world().rank() / (c.l.tp * c.l.gtp) : 0;
}

// This rank's shard of weight i's gradient at a step; padding rows hold 3 (they must not matter).
Matrix gradient(const Case& c, std::size_t i, int step, const ProcessGroups& pg) {
  const auto seed =
      1000 * static_cast<std::uint64_t>(expert_rank(c)) + 10 * i + static_cast<std::uint64_t>(step);
  const Matrix full = test::random_matrix(c.l.m, c.l.n, seed);
  return test::shard_for(full.view(), c.l, pg.tp.rank(), pg.gtp.rank(), 3.0f);
}

double spectral(Index m, Index n) {
  return muon_scale(ScaleMode::kSpectral, m, n);
}

// ---- OwnerOrthogonalizer -----------------------------------------------------------------------

// The cases' layouts and their step-0 update shards, twice: one copy to run, one to compare.
struct Shards {
  std::vector<detail::ShardLayout> layouts;
  std::vector<Matrix> run, reference;
};
Shards shards_of(const std::vector<Case>& cases, Groups& groups) {
  Shards out;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const ProcessGroups& pg = groups.get(cases[i].l).pg;
    out.layouts.push_back(test::shard_layout(cases[i].l, pg));
    out.run.push_back(gradient(cases[i], i, 0, pg));
    out.reference.push_back(Matrix::from(out.run.back().view()));
  }
  return out;
}

// Owner = duplicated on the same update shards, for both algorithms; the owners of each bucket
// are LPT on the weights' NS FLOPs; unsharded weights have none. Returns the owners.
std::vector<int> check_orthogonalizer(const std::vector<Case>& cases) {
  std::vector<int> last;
  for (NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    Groups groups;
    NsOptions ns;
    auto [layouts, owner_u, dup_u] = shards_of(cases, groups);
    std::vector<detail::OwnerOrthogonalizer::Weight> weights;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const ProcessGroups& pg = groups.get(cases[i].l).pg;
      weights.push_back({owner_u[i].view(), &layouts[i], &pg.tp, &pg.gtp, algorithm});
      NsOptions one = ns;
      one.algorithm = algorithm;
      detail::orthogonalize_shard(dup_u[i].view(), layouts[i], pg.tp, pg.gtp, TpMode::kDuplicated,
                                  one, spectral, cpu_compute());
    }
    detail::OwnerOrthogonalizer orth(detail::ns_flops_cost(ns));
    orth.run(weights, ns, spectral, cpu_compute());
    for (std::size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(relative_error(owner_u[i].view(), dup_u[i].view()), 0.0)
          << cases[i].l.label << " " << to_string(algorithm);
    }
    // Owners per bucket: LPT over the bucket's weights in order, on ns_flops of the full matrix.
    const std::vector<int>& owners = orth.last_owners();
    EXPECT_EQ(owners.size(), cases.size());
    if (owners.size() != cases.size()) return {};
    last = owners;
    for (auto& [config, entry] : groups.map) {
      std::vector<double> flops;
      std::vector<int> got;
      for (std::size_t i = 0; i < cases.size(); ++i) {
        if (std::pair(cases[i].l.tp, cases[i].l.gtp) != config) continue;
        NsOptions o = ns;
        o.algorithm = algorithm;
        flops.push_back(ns_flops(cases[i].l.m, cases[i].l.n, o));
        got.push_back(owners[i]);
      }
      const int ranks = config.first * config.second;
      if (ranks == 1) {
        EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](int o) { return o == -1; }));
      } else {
        EXPECT_EQ(got, lpt_assign(flops, ranks))
            << "bucket " << config.first << "x" << config.second;
      }
    }
  }
  return last;
}

TEST(OwnerOrthogonalizer, EqualsDuplicatedForEveryLayout) {
  check_orthogonalizer(mixed_cases(test::world().size()));
}

TEST(OwnerOrthogonalizer, UnevenBucketsAndRanksThatOwnNothing) {
  const int w = test::world().size();
  // w + 1 weights and an unsharded one: every rank owns one, one rank owns two.
  const std::vector<int> uneven = check_orthogonalizer(uneven_cases(w));
  ASSERT_EQ(uneven.size(), static_cast<std::size_t>(w + 2));
  EXPECT_EQ(uneven.back(), -1);  // the unsharded weight
  if (w > 1) {
    std::vector<int> per_rank(static_cast<std::size_t>(w), 0);
    for (std::size_t i = 0; i + 1 < uneven.size(); ++i)
      ++per_rank.at(static_cast<std::size_t>(uneven[i]));
    EXPECT_EQ(*std::min_element(per_rank.begin(), per_rank.end()), 1);
    EXPECT_EQ(*std::max_element(per_rank.begin(), per_rank.end()), 2);
  }
  // One weight: one owner (rank 0 of the grid), w - 1 ranks own nothing yet take part.
  EXPECT_EQ(check_orthogonalizer(single_case(w)), (std::vector<int>{w > 1 ? 0 : -1}));
}

// ---- WeightOrthogonalizer ----------------------------------------------------------------------

// The step's entry point: every mode in one call (the modes cycled over the weights, owner among
// them) equals each weight orthogonalised alone, bit for bit: orthogonalize_shard in its mode,
// owner as duplicated. Its owners are those of the owner weights.
TEST(WeightOrthogonalizer, EveryModeInOneCallEqualsEachWeightAlone) {
  const std::vector<Case> cases = mixed_cases(test::world().size());
  const TpMode modes[] = {TpMode::kOwner, TpMode::kDuplicated, TpMode::kDistributed,
                          TpMode::kBlockwise};
  for (NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    Groups groups;
    NsOptions ns, one;
    one.algorithm = algorithm;
    auto [layouts, got, want] = shards_of(cases, groups);
    std::vector<detail::ShardedWeight> weights;
    std::size_t owned = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const ProcessGroups& pg = groups.get(cases[i].l).pg;
      const TpMode mode = modes[i % std::size(modes)];
      owned += mode == TpMode::kOwner;
      weights.push_back({got[i].view(), &layouts[i], &pg.tp, &pg.gtp, mode, algorithm});
      detail::orthogonalize_shard(want[i].view(), layouts[i], pg.tp, pg.gtp,
                                  mode == TpMode::kOwner ? TpMode::kDuplicated : mode, one,
                                  spectral, cpu_compute());
    }
    detail::WeightOrthogonalizer orth;
    orth.run(weights, ns, spectral, cpu_compute());
    for (std::size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(relative_error(got[i].view(), want[i].view()), 0.0)
          << cases[i].l.label << " " << to_string(weights[i].mode) << " " << to_string(algorithm);
    }
    EXPECT_EQ(orth.last_owners().size(), owned);
  }
}

// ---- Muon --------------------------------------------------------------------------------------

struct MuonRun {
  std::vector<Matrix> params;
  std::vector<ParamInfo> info;
};

// Three Muon steps on the cases; after_second(groups) runs after the second step, with the
// groups' counts of that step alone. profile: the options' (auto prices with it, refined model).
MuonRun run_muon(const std::vector<Case>& cases, TpMode mode, NsAlgorithm algorithm,
                 const std::function<void(Groups&)>& after_second = {},
                 const char* profile = "none") {
  MuonOptions o;
  o.lr = 0.5;
  o.tp_mode = mode;
  o.ns_algorithm = algorithm;
  if (std::string_view(profile) != "none") {
    o.cost_model = "refined";
    o.profile = profile;
  }
  Muon opt(o, test::world(), cpu_compute());
  Groups groups;
  MuonRun r;
  r.params.reserve(cases.size());
  for (const Case& c : cases) {
    const ProcessGroups& pg = groups.get(c.l).pg;
    r.params.push_back(test::random_matrix(c.l.shard_rows(), c.l.n_tp(), 99));
    ParamSpec s = test::layout_spec(c.l, pg, r.params.back().view(), c.l.label);
    s.expert = c.expert;
    s.expert_rank = expert_rank(c);
    opt.add_parameter(s);
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<Matrix> g;
    std::vector<ConstMatrixView> views;
    for (std::size_t i = 0; i < cases.size(); ++i)
      g.push_back(gradient(cases[i], i, step, groups.get(cases[i].l).pg));
    for (const Matrix& x : g)
      views.push_back(x.view());
    if (step == 1) groups.reset();
    opt.step(views);
    if (step == 1 && after_second) after_second(groups);
  }
  r.info = opt.parameters();
  return r;
}

void expect_bit_equal(const std::vector<Case>& cases, NsAlgorithm algorithm) {
  const MuonRun owner = run_muon(cases, TpMode::kOwner, algorithm);
  const MuonRun dup = run_muon(cases, TpMode::kDuplicated, algorithm);
  const NsAlgorithm used = algorithm == NsAlgorithm::kGram ? algorithm : NsAlgorithm::kStandard;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(relative_error(owner.params[i].view(), dup.params[i].view()), 0.0)
        << cases[i].l.label << " " << to_string(algorithm);
    EXPECT_EQ(owner.info[i].mode, TpMode::kOwner);
    EXPECT_EQ(owner.info[i].algorithm, used);
    EXPECT_EQ(dup.info[i].algorithm, used);
  }
}

TEST(MuonOwner, BitEqualToDuplicated) {
  const int w = test::world().size();
  for (NsAlgorithm a : {NsAlgorithm::kAuto, NsAlgorithm::kGram}) {  // auto: standard when fixed
    expect_bit_equal(mixed_cases(w), a);
    expect_bit_equal(uneven_cases(w), a);
    expect_bit_equal(single_case(w), a);
  }
}

// Per step (after the first): one all-to-all per stage (GTP, TP) per pipelined chunk and
// direction (min(weights, kDefaultPipeline) chunks: the next chunks' gather stages and the
// earlier ones' scatter stages in flight while a chunk's NS runs), whatever the number of
// weights beyond that; no all-gather, and the bucket's composition check (one small all-reduce
// per group); the bytes are each weight's matrix in and out. Duplicated all-gathers per weight.
TEST(MuonOwner, OneAllToAllPerStagePerChunk) {
  const Communicator& world = test::world();
  const int w = world.size();
  const std::vector<Case> cases = mixed_cases(w);
  run_muon(cases, TpMode::kOwner, NsAlgorithm::kAuto, [&](Groups& groups) {
    for (auto& [config, e] : groups.map) {
      const auto [T, G] = config;
      // Each stage moves, over one grid, the weights' T x (padded rows x n_tp) in each direction.
      std::int64_t per_grid = 0;
      for (const Case& c : cases)
        if (c.l.tp == T && c.l.gtp == G)
          per_grid += 2 * T * (c.l.m_tp() + c.l.pad) * c.l.n_tp() * 4;
      const std::int64_t grids = w / (T * G);
      const std::string label = std::to_string(T) + "x" + std::to_string(G);
      std::size_t weights = 0;
      for (const Case& c : cases)
        weights += c.l.tp == T && c.l.gtp == G ? 1 : 0;
      const std::size_t per_direction =
          std::min<std::size_t>(weights, detail::OwnerOrthogonalizer::kDefaultPipeline);
      EXPECT_EQ(e.tp_stats->all_to_all.calls, T > 1 ? 2 * per_direction : 0u) << label;
      EXPECT_EQ(e.gtp_stats->all_to_all.calls, G > 1 ? 2 * per_direction : 0u) << label;
      EXPECT_EQ(e.tp_stats->all_gather.calls + e.gtp_stats->all_gather.calls, 0u) << label;
      // The bucket's composition check, on every step: one all_agree per group of the grid.
      EXPECT_EQ(e.tp_stats->all_reduce.calls, T > 1 ? 1u : 0u) << label;
      EXPECT_EQ(e.gtp_stats->all_reduce.calls, G > 1 ? 1u : 0u) << label;
      const auto tp_bytes =
          world.all_reduce(static_cast<std::int64_t>(e.tp_stats->all_to_all.bytes));
      const auto gtp_bytes =
          world.all_reduce(static_cast<std::int64_t>(e.gtp_stats->all_to_all.bytes));
      EXPECT_EQ(tp_bytes, T > 1 ? grids * per_grid : 0) << label;
      EXPECT_EQ(gtp_bytes, G > 1 ? grids * per_grid : 0) << label;
    }
  });
  if (w == 1) return;
  run_muon(cases, TpMode::kDuplicated, NsAlgorithm::kAuto, [&](Groups& groups) {
    const Groups::Entry& gtp_only = groups.map.at({1, w});
    EXPECT_EQ(gtp_only.gtp_stats->all_to_all.calls, 0u);
    EXPECT_GE(gtp_only.gtp_stats->all_gather.calls, 4u);  // the bucket's four weights
  });
}

// tp_mode=auto on the h100 profile over eight tiny weights split by rows over the world: owner,
// whose estimate (plan_bucket, the optimizer's schedule) prices the bucket in one chunk, and the
// optimizer runs that one chunk: one gather and one scatter per step (the fixed 4 chunks: 8).
TEST(MuonOwner, AutoRunsTheChunkCountItPriced) {
  const int w = test::world().size();
  if (w == 1) GTEST_SKIP() << "no bucket on one rank";
  std::vector<Case> cases;
  for (int i = 0; i < 8; ++i)
    cases.push_back({{.label = fmt::format("tiny {}", i), .m = 64, .n = 32, .gtp = w}});
  const std::optional<HardwareProfile> h100 = resolve_profile("h100");
  ASSERT_TRUE(h100.has_value());
  // The optimizer's key of each (auto_key of its layout with the default options).
  const AutoKey key = auto_key(ShardLayout{.m = 64, .n = 32, .gtp_size = w},
                               MuonOptions{}.ns_options(), NsAlgorithm::kAuto, false);
  const std::vector<AutoKey> keys(8, key);
  const BucketPlan plan = plan_bucket(keys, &*h100, CostModel::kRefined);
  ASSERT_TRUE(plan.owner.has_value());
  EXPECT_EQ(plan.owner->chunks, 1);
  const MuonRun r = run_muon(
      cases, TpMode::kAuto, NsAlgorithm::kAuto,
      [&](Groups& groups) {
        const Groups::Entry& e = groups.map.at({1, w});
        EXPECT_EQ(e.gtp_stats->all_to_all.calls, 2u * static_cast<std::size_t>(plan.owner->chunks));
        EXPECT_EQ(e.gtp_stats->all_gather.calls, 0u);
      },
      "h100");
  for (const ParamInfo& p : r.info)
    EXPECT_EQ(p.mode, TpMode::kOwner) << p.name;
}

}  // namespace
}  // namespace distmuon
