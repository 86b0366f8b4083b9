// tp_mode=auto with the refined model (owner and Gram among the candidates) end to end: the plan
// is plan_bucket's on the same keys and the same on every rank; with the standard algorithm
// pinned the result stays within rounding of duplicated; checkpoints of owner-mode parameters
// (fixed and auto-chosen) resume bit for bit.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <random>
#include <set>

#include "distmuon/cost_model.h"
#include "distmuon/hardware_profile.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

using test::TestLayout;

// Two buckets on the world of w ranks: eight equal small weights split by rows over all ranks
// (latency-bound: owner's two all-to-alls, the bucket in one chunk as the cost model chooses
// for it, beat eight per-weight collectives), and one larger weight split by columns over all
// ranks, alone in its bucket (owner would run the same NS as duplicated on one rank but move the
// matrix in and out, where duplicated all-gathers it once).
std::vector<TestLayout> layouts(int w) {
  std::vector<TestLayout> out;
  for (int i = 0; i < 8; ++i)
    out.push_back({.label = fmt::format("small {}", i), .m = 64, .n = 32, .gtp = w});
  out.push_back({.label = "large", .m = 256, .n = 512, .tp_dim = 1, .tp = w});
  return out;
}

constexpr const char* kProfile = "h100";

struct Result {
  std::vector<Matrix> params;
  std::vector<ParamInfo> info;
  std::map<AutoKey, AutoChoice> decisions;
};

MuonOptions options(TpMode mode, NsAlgorithm algorithm, const char* profile = kProfile) {
  MuonOptions o;
  o.lr = 0.5;
  o.tp_mode = mode;
  o.ns_algorithm = algorithm;
  o.cost_model = "refined";
  o.profile = profile;
  return o;
}

// `steps` Muon steps over the layouts (both buckets share the world's groups per configuration).
struct Harness {
  explicit Harness(const std::vector<TestLayout>& ls)
      : ls(ls),
        gtp_groups(make_process_groups(test::world(), 1, test::world().size())),
        tp_groups(make_process_groups(test::world(), test::world().size(), 1)) {}
  const ProcessGroups& groups(const TestLayout& l) const {
    return l.tp > 1 ? tp_groups : gtp_groups;
  }
  void add(Muon& opt, std::vector<Matrix>& params) const {
    for (const TestLayout& l : ls) {
      if (params.size() < ls.size())
        params.push_back(test::random_matrix(l.shard_rows(), l.n_tp(), 5));
      opt.add_parameter(test::layout_spec(l, groups(l), params[&l - ls.data()].view(), l.label));
    }
  }
  void step(Muon& opt, int step) const {
    std::vector<Matrix> g;
    std::vector<ConstMatrixView> views;
    for (std::size_t i = 0; i < ls.size(); ++i) {
      const Matrix full =
          test::random_matrix(ls[i].m, ls[i].n, 10 * i + static_cast<std::uint64_t>(step));
      const ProcessGroups& pg = groups(ls[i]);
      g.push_back(test::shard_for(full.view(), ls[i], pg.tp.rank(), pg.gtp.rank()));
    }
    for (const Matrix& x : g)
      views.push_back(x.view());
    opt.step(views);
  }
  Result run(const MuonOptions& o, int steps) const {
    Muon opt(o, test::world(), cpu_compute());
    Result r;
    r.params.reserve(ls.size());
    add(opt, r.params);
    for (int s = 0; s < steps; ++s)
      step(opt, s);
    r.info = opt.parameters();
    r.decisions = opt.auto_decisions();
    return r;
  }
  std::vector<TestLayout> ls;
  ProcessGroups gtp_groups, tp_groups;
};

// The key the optimizer resolves a weight on (cost_model.h): the group it is split over, its
// partition, the NS settings; no group crosses a domain on one host.
AutoKey key_of(const TestLayout& l, const MuonOptions& o) {
  const bool tp = l.tp > 1;
  return AutoKey{.m = l.m,
                 .n = l.n,
                 .group_size = tp ? l.tp : l.gtp,
                 .partition_dim = tp ? l.tp_dim : 0,
                 .crosses_domain = false,
                 .steps = o.steps,
                 .use_syrk = o.use_syrk,
                 .elem_size = 4,
                 .algorithm = o.ns_algorithm,
                 .gram_formations = [&] {
                   NsOptions ns = o.ns_options();
                   ns.algorithm = NsAlgorithm::kGram;
                   return gram_ns_gram_count(ns);
                 }()};
}

std::int64_t code(const ParamInfo& p) {
  return static_cast<std::int64_t>(*p.mode) * 4 + static_cast<std::int64_t>(p.algorithm);
}

TEST(MuonOwnerAuto, PlanIsPlanBucketsOnEveryRank) {
  const Communicator& world = test::world();
  const std::vector<TestLayout> ls = layouts(world.size());
  const MuonOptions o = options(TpMode::kAuto, NsAlgorithm::kAuto);
  const Result r = Harness(ls).run(o, 1);
  const std::optional<HardwareProfile> profile = resolve_profile(kProfile);
  ASSERT_TRUE(profile.has_value());
  // Buckets as the optimizer forms them: the parameters that share their groups, in order.
  std::vector<std::vector<std::size_t>> buckets(2);
  for (std::size_t i = 0; i < ls.size(); ++i)
    buckets[ls[i].tp > 1 ? 1 : 0].push_back(i);
  std::set<TpMode> modes;
  for (const auto& bucket : buckets) {
    std::vector<AutoKey> keys;
    for (const std::size_t i : bucket) {
      keys.push_back(key_of(ls[i], o));
      EXPECT_TRUE(r.decisions.contains(keys.back())) << describe(keys.back());
    }
    const BucketPlan plan = plan_bucket(keys, &*profile, CostModel::kRefined);
    std::printf("  bucket of %zu (%s): owner %.3g s, per-weight %.3g s -> %s\n", keys.size(),
                describe(keys[0]).c_str(), plan.owner ? plan.owner->cost() : -1.0,
                plan.per_weight_cost, to_string(plan.choices[0]).c_str());
    for (std::size_t k = 0; k < bucket.size(); ++k) {
      const ParamInfo& p = r.info[bucket[k]];
      ASSERT_TRUE(p.mode.has_value()) << p.name;
      EXPECT_EQ((AutoChoice{*p.mode, p.algorithm}), plan.choices[k]) << p.name;
      modes.insert(*p.mode);
    }
  }
  // The layouts were chosen so that both outcomes occur.
  EXPECT_TRUE(modes.contains(TpMode::kOwner));
  EXPECT_GT(modes.size(), 1u);
  // Every rank planned the same: all-gather the codes and compare with rank 0's.
  std::vector<std::int64_t> mine;
  for (const ParamInfo& p : r.info)
    mine.push_back(code(p));
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(world.size()));
  world.all_gather<std::int64_t>(mine, all);
  for (int rank = 1; rank < world.size(); ++rank)
    EXPECT_TRUE(std::equal(mine.begin(), mine.end(),
                           all.begin() + rank * static_cast<std::ptrdiff_t>(mine.size())))
        << "rank " << rank;
}

// With the standard algorithm pinned, auto runs owner (bit-equal to duplicated) or distributed
// (the same NS with the Gram matrix summed over the group in another order): within fp32
// rounding of duplicated, 1e-5 relative as in test_muon_auto. Without a profile the model
// compares FLOPs and picks owner for the small weights and distributed for the large one;
// measured after 3 steps: 0 (owner), 0 (distributed, 2 ranks) and 4.5e-7 (distributed, 4 ranks).
TEST(MuonOwnerAuto, StandardPinnedStaysWithinRoundingOfDuplicated) {
  const std::vector<TestLayout> ls = layouts(test::world().size());
  const Harness h(ls);
  const Result autos = h.run(options(TpMode::kAuto, NsAlgorithm::kStandard, "none"), 3);
  const Result dup = h.run(options(TpMode::kDuplicated, NsAlgorithm::kStandard), 3);
  for (std::size_t i = 0; i < ls.size(); ++i) {
    EXPECT_EQ(autos.info[i].algorithm, NsAlgorithm::kStandard) << ls[i].label;
    const double err = relative_error(autos.params[i].view(), dup.params[i].view());
    std::printf("  %-8s auto -> %-11s rel.err vs duplicated %.3e\n", ls[i].label.c_str(),
                to_string(*autos.info[i].mode), err);
    EXPECT_LE(err, 1e-5) << ls[i].label << " " << to_string(*autos.info[i].mode);
    if (autos.info[i].mode == TpMode::kOwner) EXPECT_EQ(err, 0.0) << ls[i].label;
  }
}

std::string temp_dir(const Communicator& world) {
  std::string dir;
  if (world.rank() == 0) {
    dir = (std::filesystem::temp_directory_path() /
           fmt::format("distmuon-owner-{}-{}", ::getpid(), std::random_device{}()))
              .string();
  }
  return world.broadcast_string(dir, 0);
}

// Save after step 1, load into a fresh optimizer over a copy of the parameters, step both: the
// same bits, and the loaded parameters run the mode and algorithm that were saved.
void check_resume(const MuonOptions& o) {
  const Communicator& world = test::world();
  const std::vector<TestLayout> ls = layouts(world.size());
  const Harness h(ls);
  const std::string dir = temp_dir(world);
  Muon first(o, world, cpu_compute());
  std::vector<Matrix> a;
  a.reserve(ls.size());
  h.add(first, a);
  h.step(first, 0);
  first.save(dir);
  const std::vector<ParamInfo> saved = first.parameters();
  bool any_owner = false;
  for (const ParamInfo& p : saved)
    any_owner |= p.mode == TpMode::kOwner;
  EXPECT_TRUE(any_owner) << "the case must run owner mode";

  Muon second(o, world, cpu_compute());
  std::vector<Matrix> b;
  b.reserve(ls.size());
  for (const Matrix& x : a)
    b.push_back(Matrix::from(x.view()));
  h.add(second, b);
  second.load(dir);
  EXPECT_EQ(second.step_count(), 1);
  if (o.tp_mode == TpMode::kAuto) {
    // Restored from the checkpoint, before any step plans anything.
    for (std::size_t i = 0; i < ls.size(); ++i) {
      EXPECT_EQ(second.parameters()[i].mode, saved[i].mode) << ls[i].label;
      EXPECT_EQ(second.parameters()[i].algorithm, saved[i].algorithm) << ls[i].label;
    }
    EXPECT_EQ(second.auto_decisions(), first.auto_decisions());
  }
  h.step(first, 1);
  h.step(second, 1);
  for (std::size_t i = 0; i < ls.size(); ++i) {
    EXPECT_EQ(relative_error(a[i].view(), b[i].view()), 0.0) << ls[i].label;
    EXPECT_EQ(second.parameters()[i].mode, saved[i].mode) << ls[i].label;
    EXPECT_EQ(second.parameters()[i].algorithm, saved[i].algorithm) << ls[i].label;
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(MuonOwnerAuto, CheckpointResumesFixedOwnerMode) {
  check_resume(options(TpMode::kOwner, NsAlgorithm::kStandard));
  check_resume(options(TpMode::kOwner, NsAlgorithm::kGram));
}

TEST(MuonOwnerAuto, CheckpointResumesAutoChosenOwner) {
  check_resume(options(TpMode::kAuto, NsAlgorithm::kAuto));
}

}  // namespace
}  // namespace distmuon
