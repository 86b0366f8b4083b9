// tp_mode=auto with plan=measure: the plan is the same on every rank and follows the measured
// times (each weight its fastest candidate, owner for a bucket only when its run beats the sum of
// those); the times go to the wisdom file, a second run reuses them without timing anything and
// steps to the same weights bit for bit; wisdom of another host is ignored; a damaged file stops
// every rank with its name.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "distmuon/measure_plan.h"
#include "distmuon/wisdom.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using test::TestLayout;

// Two buckets: four small weights split by rows over the world, one split by columns.
std::vector<TestLayout> layouts(int w) {
  std::vector<TestLayout> out;
  for (int i = 0; i < 4; ++i)
    out.push_back({.label = "small " + std::to_string(i), .m = 64, .n = 32, .gtp = w});
  out.push_back({.label = "wide", .m = 48, .n = 128, .tp_dim = 1, .tp = w});
  return out;
}

MuonOptions options(const std::string& wisdom) {
  MuonOptions o;
  o.lr = 0.5;
  o.tp_mode = TpMode::kAuto;
  o.ns_algorithm = NsAlgorithm::kAuto;
  o.plan = PlanMode::kMeasure;
  o.wisdom = wisdom;
  return o;
}

struct Outcome {
  std::vector<Matrix> params;
  std::vector<ParamInfo> info;
  std::map<AutoKey, AutoChoice> decisions;
  std::size_t timed = 0;
};

// One Muon step over the layouts from fixed weights and gradients.
Outcome run_once(const MuonOptions& o) {
  const Communicator& world = test::world();
  const std::vector<TestLayout> ls = layouts(world.size());
  const ProcessGroups gtp = make_process_groups(world, 1, world.size());
  const ProcessGroups tp = make_process_groups(world, world.size(), 1);
  Muon opt(o, world, cpu_compute());
  Outcome r;
  std::vector<Matrix> grads;
  std::vector<ConstMatrixView> views;
  for (std::size_t i = 0; i < ls.size(); ++i) {
    const ProcessGroups& g = ls[i].tp > 1 ? tp : gtp;
    r.params.push_back(test::shard_for(test::random_matrix(ls[i].m, ls[i].n, i).view(), ls[i],
                                       g.tp.rank(), g.gtp.rank()));
    grads.push_back(test::shard_for(test::random_matrix(ls[i].m, ls[i].n, 100 + i).view(), ls[i],
                                    g.tp.rank(), g.gtp.rank()));
  }
  for (std::size_t i = 0; i < ls.size(); ++i) {
    opt.add_parameter(
        test::layout_spec(ls[i], ls[i].tp > 1 ? tp : gtp, r.params[i].view(), ls[i].label));
    views.push_back(grads[i].view());
  }
  opt.step(views);
  r.info = opt.parameters();
  r.decisions = opt.auto_decisions();
  r.timed = opt.plan_timed_runs();
  return r;
}

std::int64_t code(const ParamInfo& p) {
  return to_code(AutoChoice{*p.mode, p.algorithm});
}

// A wisdom path shared by the ranks (rank 0's temporary directory), removed at the end.
struct SharedFile {
  SharedFile() {
    const Communicator& world = test::world();
    std::string dir;
    if (world.rank() == 0) {
      dir = (fs::temp_directory_path() / ("distmuon-measure-" + std::to_string(getpid()))).string();
      fs::create_directories(dir);
    }
    path = fs::path(world.broadcast_string(dir, 0)) / "wisdom.json";
  }
  ~SharedFile() {
    test::world().barrier();
    if (test::world().rank() == 0) fs::remove_all(path.parent_path());
  }
  fs::path path;
};

TEST(MuonMeasure, SamePlanEverywhereFollowsTheTimesAndReusesWisdom) {
  const Communicator& world = test::world();
  if (world.size() < 2) GTEST_SKIP() << "needs sharded weights (2 or more ranks)";
  SharedFile file;
  const Outcome first = run_once(options(file.path.string()));
  EXPECT_GT(first.timed, 0u);

  // The plan is the same on every rank.
  for (const ParamInfo& p : first.info) {
    ASSERT_TRUE(p.mode.has_value()) << p.name;
    const std::vector<std::int64_t> all = world.all_gather(code(p));
    for (std::int64_t c : all)
      EXPECT_EQ(c, all[0]) << p.name;
  }

  // It follows the recorded times: owner for a bucket only when its fastest owner run beats the
  // sum of its weights' fastest candidates, else each weight's fastest candidate.
  if (world.rank() == 0) {
    const Wisdom w = Wisdom::load(file.path, {this_host(), "none", "refined"});
    const std::vector<TestLayout> ls = layouts(world.size());
    const std::vector<std::vector<std::size_t>> buckets = {{0, 1, 2, 3}, {4}};
    for (const auto& b : buckets) {
      std::vector<AutoKey> keys;
      double per_weight = 0;
      for (const std::size_t i : b) {
        const auto it = std::find_if(first.decisions.begin(), first.decisions.end(), [&](auto& d) {
          return d.first.m == ls[i].m && d.first.n == ls[i].n;
        });
        ASSERT_NE(it, first.decisions.end()) << ls[i].label;
        keys.push_back(it->first);
        const auto* timed = w.find(it->first);
        ASSERT_NE(timed, nullptr) << describe(it->first);
        per_weight += timed->front().seconds;
        if (first.info[i].mode != TpMode::kOwner) {
          EXPECT_EQ(to_code(AutoChoice{*first.info[i].mode, first.info[i].algorithm}),
                    to_code(timed->front().choice))
              << ls[i].label;
        }
      }
      const auto* owner = w.find_owner(keys);
      ASSERT_NE(owner, nullptr);
      const bool chose_owner = first.info[b[0]].mode == TpMode::kOwner;
      EXPECT_EQ(chose_owner, owner->front().seconds < per_weight);
      for (const std::size_t i : b)
        EXPECT_EQ(first.info[i].mode == TpMode::kOwner, chose_owner) << ls[i].label;
    }
  }

  // A second run reads every time from the wisdom file: nothing is timed, the plan and the
  // stepped weights are the same (the timed runs of the first left the weights alone).
  const Outcome second = run_once(options(file.path.string()));
  EXPECT_EQ(second.timed, 0u);
  for (std::size_t i = 0; i < first.info.size(); ++i) {
    EXPECT_EQ(code(second.info[i]), code(first.info[i])) << first.info[i].name;
    const auto a = second.params[i].values(), b = first.params[i].values();
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << first.info[i].name;
  }
}

TEST(MuonMeasure, WisdomOfAnotherHostIsIgnored) {
  const Communicator& world = test::world();
  if (world.size() < 2) GTEST_SKIP() << "needs sharded weights (2 or more ranks)";
  SharedFile file;
  run_once(options(file.path.string()));
  if (world.rank() == 0) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(file.path));
    for (auto& e : j["entries"])
      e["host"]["hostname"] = "elsewhere";
    std::ofstream(file.path) << j.dump();
  }
  world.barrier();
  EXPECT_GT(run_once(options(file.path.string())).timed, 0u);
}

TEST(MuonMeasure, DamagedWisdomStopsEveryRank) {
  const Communicator& world = test::world();
  if (world.size() < 2) GTEST_SKIP() << "needs sharded weights (2 or more ranks)";
  SharedFile file;
  if (world.rank() == 0) std::ofstream(file.path) << "{\"format\": ";
  world.barrier();
  try {
    run_once(options(file.path.string()));
    ADD_FAILURE() << "a damaged wisdom file was accepted";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find(file.path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
}

TEST(MuonMeasure, WisdomNeedsPlanMeasure) {
  MuonOptions o = options("w.json");
  o.plan = PlanMode::kEstimate;
  EXPECT_THROW(o.validate(), Error);
}

// A target whose runs count themselves; the last rank can fail building a task or ask for more
// memory than there is, and every rank can fail a timed run.
class FaultyTarget final : public MeasureTarget {
 public:
  enum class Fault { kNone, kBuild, kRun, kMemory };
  explicit FaultyTarget(Fault fault) : fault_(fault) {}

  MeasureTask weight_task(std::size_t, const AutoChoice&) override { return task(); }
  MeasureTask owner_task(std::size_t, std::span<const NsAlgorithm>) override { return task(); }
  std::string device() const override { return "cpu-openblas"; }
  double scratch_bytes(std::span<const std::size_t>) const override {
    return fault_ == Fault::kMemory && failing() ? 1e30 : 1024;
  }
  int runs = 0;

 private:
  bool failing() const { return test::world().rank() == test::world().size() - 1; }
  MeasureTask task() {
    if (fault_ == Fault::kBuild && failing()) throw Error("no room for the copies here");
    return {[this] {
              // The third run on the failing rank (after runs that all ranks completed).
              if (++runs == 3 && fault_ == Fault::kRun) throw Error("the timed run failed here");
            },
            {}};
  }
  Fault fault_;
};

// The planner with the target over one key of the world's size, alone in its bucket.
std::string plan_error(FaultyTarget& target, const std::string& wisdom = {}) {
  const Communicator& world = test::world();
  const std::vector<AutoKey> keys = {
      {.m = 64, .n = 32, .group_size = std::max(world.size(), 2), .algorithm = NsAlgorithm::kAuto}};
  const std::vector<std::vector<std::size_t>> buckets = {{0}};
  MeasurePlanOptions o;
  o.reps = 3;
  o.wisdom = wisdom;
  try {
    plan_by_measuring(world, keys, buckets, target, AutoModeResolver(), o);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST(MuonMeasure, AFailureOnOneRankReachesEveryRank) {
  {
    FaultyTarget ok(FaultyTarget::Fault::kNone);
    EXPECT_EQ(plan_error(ok), "");
    EXPECT_GT(ok.runs, 3);
  }
  {
    // A run's exception is not caught (candidate_runner.h): here every rank's third run throws,
    // and each rank gets its own error, unwrapped. On one rank only it would be that rank's
    // error, on which a program aborts the job (the fault matrix's throw cases inside timed runs:
    // tests/train/test_fault_matrix.cpp).
    FaultyTarget run(FaultyTarget::Fault::kRun);
    EXPECT_EQ(plan_error(run), "the timed run failed here");
    EXPECT_EQ(run.runs, 3);  // no rank timed anything after the failing run
  }
  {
    FaultyTarget build(FaultyTarget::Fault::kBuild);
    const std::string why = plan_error(build);
    EXPECT_NE(why.find("preparing the candidates"), std::string::npos) << why;
    EXPECT_NE(why.find("no room for the copies here"), std::string::npos) << why;
    EXPECT_EQ(build.runs, 0);
  }
  {
    FaultyTarget memory(FaultyTarget::Fault::kMemory);
    const std::string why = plan_error(memory);
    EXPECT_NE(why.find("the timed copies needs about"), std::string::npos) << why;
    EXPECT_EQ(memory.runs, 0);
  }
}

// A wisdom path that cannot be written stops every rank before anything is timed.
TEST(MuonMeasure, AnUnwritableWisdomPathStopsEveryRankBeforeTiming) {
  SharedFile file;
  if (test::world().rank() == 0) fs::create_directories(file.path);  // a folder, not a file
  test::world().barrier();
  FaultyTarget target(FaultyTarget::Fault::kNone);
  const std::string why = plan_error(target, file.path.string());
  EXPECT_NE(why.find("is a directory"), std::string::npos) << why;
  EXPECT_NE(why.find(file.path.string()), std::string::npos) << why;
  EXPECT_EQ(target.runs, 0);
}

}  // namespace
}  // namespace distmuon
