// tp_mode=auto end to end: auto equals duplicated for dense and expert weights, decisions follow
// the domain crossing of each weight's own groups, and decisions survive a checkpoint.
//
// Tolerance 1e-5 relative: auto runs duplicated or distributed; both are the Newton-Schulz of the
// full matrix, distributed with the Gram matrix summed over the group in another order (fp32
// rounding, see test_muon_layouts).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "distmuon/topology.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

using test::TestLayout;

struct Case {
  TestLayout layout;
  bool expert = false;
};

// Per rank: its groups and shard of one parameter.
struct Held {
  ProcessGroups groups;
  Matrix local;
  int tp_rank() const { return groups.tp.rank(); }
  int gtp_rank() const { return groups.gtp.rank(); }
};

ParamSpec spec(const TestLayout& l, Held& h, bool expert) {
  ParamSpec s = test::layout_spec(l, h.groups, h.local.view(), l.label);
  s.expert = expert;
  s.expert_rank = expert ? test::world().rank() / (l.tp * l.gtp) : 0;
  return s;
}

// Runs all cases in one optimizer for three steps; returns the shards and the optimizer's view.
struct Result {
  std::vector<Matrix> shards;
  std::vector<ParamInfo> info;
  std::map<AutoKey, AutoChoice> decisions;
};

// The reference model by default: it chooses between duplicated and distributed (standard NS)
// only, which these tests are about; owner and Gram candidates: test_owner_ns.cpp and
// test_muon_owner_auto.cpp.
Result run(const std::vector<Case>& cases, TpMode mode, const std::string& model = "reference") {
  const Communicator& world = test::world();
  MuonOptions o;
  o.lr = 1.0;
  o.tp_mode = mode;
  o.cost_model = model;
  Muon opt(o, world, cpu_compute());
  std::vector<Held> held;
  held.reserve(cases.size());
  for (const Case& c : cases) {
    const TestLayout& l = c.layout;
    held.push_back({make_process_groups(world, l.tp, l.gtp), Matrix(l.shard_rows(), l.n_tp())});
    opt.add_parameter(spec(l, held.back(), c.expert));
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<Matrix> g;
    std::vector<ConstMatrixView> views;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const TestLayout& l = cases[i].layout;
      // Expert-parallel ranks hold different experts: different data per expert rank.
      const auto ep = static_cast<std::uint64_t>(spec(l, held[i], cases[i].expert).expert_rank);
      const Matrix full =
          test::random_matrix(l.m, l.n, 1000 * ep + 10 * i + static_cast<std::uint64_t>(step));
      g.push_back(test::shard_for(full.view(), l, held[i].tp_rank(), held[i].gtp_rank(), 3.0f));
    }
    for (const Matrix& x : g)
      views.push_back(x.view());
    opt.step(views);
  }
  Result r;
  for (Held& h : held)
    r.shards.push_back(std::move(h.local));
  r.info = opt.parameters();
  r.decisions = opt.auto_decisions();
  return r;
}

std::vector<Case> cases_for(int w) {
  std::vector<Case> out;
  out.push_back({{.label = "gtp tall", .m = 64, .n = 8, .gtp = w}});
  out.push_back({{.label = "gtp wide", .m = 8 * w, .n = 64, .gtp = w}});
  out.push_back({{.label = "gtp tall again", .m = 64, .n = 8, .gtp = w}});  // same key: cached
  out.push_back({{.label = "gtp pad", .m = 16 * w - 3, .n = 4, .gtp = w, .pad = 3}});
  out.push_back({{.label = "tp dim0", .m = 48, .n = 8, .tp_dim = 0, .tp = w}});
  out.push_back({{.label = "tp dim1", .m = 8, .n = 48, .tp_dim = 1, .tp = w}});
  out.push_back({{.label = "gtp qkv", .m = 48, .n = 8, .gtp = w, .qkv = {4, 2, 2}}});
  if (w == 4) {
    out.push_back({{.label = "tp2 x gtp2 dim0", .m = 64, .n = 8, .tp_dim = 0, .tp = 2, .gtp = 2}});
    out.push_back({{.label = "tp2 x gtp2 dim1", .m = 64, .n = 8, .tp_dim = 1, .tp = 2, .gtp = 2}});
  }
  // Expert weights on expert groups of 2 ranks (expert-parallel over the rest).
  const int eg = std::min(w, 2);
  out.push_back({{.label = "expert tall", .m = 64, .n = 8, .gtp = eg}, true});
  out.push_back({{.label = "expert wide", .m = 8, .n = 64, .gtp = eg}, true});
  return out;
}

TEST(MuonAuto, EqualsDuplicatedForDenseAndExpertWeights) {
  const int w = test::world().size();
  const std::vector<Case> cases = cases_for(w);
  const Result autos = run(cases, TpMode::kAuto);
  const Result dup = run(cases, TpMode::kDuplicated);
  std::set<TpMode> chosen;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_LE(relative_error(autos.shards[i].view(), dup.shards[i].view()), 1e-5)
        << cases[i].layout.label;
    ASSERT_TRUE(autos.info[i].mode.has_value()) << cases[i].layout.label;
    chosen.insert(*autos.info[i].mode);
  }
  if (w > 1) {
    // Without a profile the model counts FLOPs: tall weights split by rows favour distributed,
    // wide ones duplicated. Both must appear, else this test compares duplicated with itself.
    EXPECT_EQ(chosen, (std::set<TpMode>{TpMode::kDuplicated, TpMode::kDistributed}));
    // One decision per distinct key ("gtp tall" twice gives one).
    EXPECT_LT(autos.decisions.size(), cases.size());
    EXPECT_EQ(autos.info[0].mode, autos.info[2].mode);
  }
}

// Ranks 0-1 in NVLink domain A, 2-3 in B: the dense weight over all four ranks crosses, so auto
// keeps duplicated (no profile); the expert weights on {0, 1} and {2, 3} do not cross, and a
// tall one goes distributed.
TEST(MuonAuto, DecisionsFollowTheDomainCrossingOfEachWeightsGroups) {
  const Communicator& world = test::world();
  if (world.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  ASSERT_EQ(::setenv("DISTMUON_NVLINK_DOMAIN", world.rank() < 2 ? "A" : "B", 1), 0);
  const std::vector<Case> cases = {{{.label = "dense tall", .m = 64, .n = 8, .gtp = 4}},
                                   {{.label = "expert tall", .m = 64, .n = 8, .gtp = 2}, true}};
  const Result autos = run(cases, TpMode::kAuto);
  const Result dup = run(cases, TpMode::kDuplicated);
  ::unsetenv("DISTMUON_NVLINK_DOMAIN");
  EXPECT_EQ(autos.info[0].mode, TpMode::kDuplicated);
  EXPECT_EQ(autos.info[1].mode, TpMode::kDistributed);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_LE(relative_error(autos.shards[i].view(), dup.shards[i].view()), 1e-5)
        << cases[i].layout.label;
  }
  bool crossing_key = false;
  for (const auto& [key, mode] : autos.decisions)
    crossing_key |= key.crosses_domain;
  EXPECT_TRUE(crossing_key);
}

TEST(MuonAuto, DecisionsSurviveACheckpoint) {
  const Communicator& world = test::world();
  const int w = world.size();
  const TestLayout l{.label = "w", .m = 64, .n = 8, .gtp = w};
  std::string dir;
  if (world.rank() == 0) {
    dir = (std::filesystem::temp_directory_path() /
           fmt::format("distmuon-auto-{}-{}", ::getpid(), std::random_device{}()))
              .string();
  }
  dir = world.broadcast_string(dir, 0);
  MuonOptions o;
  o.tp_mode = TpMode::kAuto;
  Held a{make_process_groups(world, 1, w), Matrix(l.shard_rows(), l.n_tp())};
  Muon first(o, world, cpu_compute());
  first.add_parameter(spec(l, a, false));
  const Matrix g = test::shard_for(test::random_matrix(l.m, l.n, 4).view(), l, 0, a.gtp_rank());
  const ConstMatrixView grads[] = {g.view()};
  first.step(grads);
  first.save(dir);

  Held b{make_process_groups(world, 1, w), Matrix::from(a.local.view())};
  Muon second(o, world, cpu_compute());
  second.add_parameter(spec(l, b, false));
  if (w > 1) EXPECT_FALSE(second.parameters()[0].mode.has_value());  // not decided yet
  second.load(dir);
  EXPECT_EQ(second.parameters()[0].mode, first.parameters()[0].mode);
  EXPECT_EQ(second.auto_decisions(), first.auto_decisions());
  first.step(grads);
  second.step(grads);
  EXPECT_EQ(relative_error(a.local.view(), b.local.view()), 0.0);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

// The checkpoint of an auto run, for the tests below: one GTP-sharded weight over the world,
// stepped once with options o, saved into a fresh folder (returned, the same on every rank).
std::string save_auto_checkpoint(const MuonOptions& o, Held& held, const TestLayout& l) {
  const Communicator& world = test::world();
  std::string dir;
  if (world.rank() == 0) {
    dir = (std::filesystem::temp_directory_path() /
           fmt::format("distmuon-auto-{}-{}", ::getpid(), std::random_device{}()))
              .string();
  }
  dir = world.broadcast_string(dir, 0);
  Muon first(o, world, cpu_compute());
  first.add_parameter(spec(l, held, false));
  const Matrix g = test::shard_for(test::random_matrix(l.m, l.n, 4).view(), l, 0, held.gtp_rank());
  const ConstMatrixView grads[] = {g.view()};
  first.step(grads);
  first.save(dir);
  return dir;
}

// A decision saved under options that give another key (here: auto allowed to pick Gram, as
// before standard became the default) is planned again under the current options, not applied.
TEST(MuonAuto, ADecisionMadeForAnotherKeyIsPlannedAgain) {
  const Communicator& world = test::world();
  const int w = world.size();
  const TestLayout l{.label = "w", .m = 64, .n = 8, .gtp = w};
  MuonOptions saved;
  saved.tp_mode = TpMode::kAuto;
  saved.cost_model = "refined";
  saved.ns_algorithm = NsAlgorithm::kAuto;
  Held a{make_process_groups(world, 1, w), Matrix(l.shard_rows(), l.n_tp())};
  const std::string dir = save_auto_checkpoint(saved, a, l);

  MuonOptions now = saved;
  now.ns_algorithm = NsAlgorithm::kStandard;
  Held b{make_process_groups(world, 1, w), Matrix::from(a.local.view())};
  Muon second(now, world, cpu_compute());
  second.add_parameter(spec(l, b, false));
  second.load(dir);
  if (w > 1) {  // dropped: planned at the next step
    EXPECT_FALSE(second.parameters()[0].mode.has_value());
    EXPECT_TRUE(second.auto_decisions().empty());
  }
  const Matrix g = test::shard_for(test::random_matrix(l.m, l.n, 5).view(), l, 0, b.gtp_rank());
  const ConstMatrixView grads[] = {g.view()};
  second.step(grads);
  if (w > 1) {
    ASSERT_TRUE(second.parameters()[0].mode.has_value());
    EXPECT_EQ(second.parameters()[0].algorithm, NsAlgorithm::kStandard);
    ASSERT_EQ(second.auto_decisions().size(), 1u);
    EXPECT_EQ(second.auto_decisions().begin()->first.algorithm, NsAlgorithm::kStandard);
  }

  // The same options: the saved decision is applied as it is.
  Held c{make_process_groups(world, 1, w), Matrix::from(a.local.view())};
  Muon third(saved, world, cpu_compute());
  third.add_parameter(spec(l, c, false));
  third.load(dir);
  if (w > 1) {
    ASSERT_EQ(third.auto_decisions().size(), 1u);
    EXPECT_EQ(third.auto_decisions().begin()->first.algorithm, NsAlgorithm::kAuto);
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

// Options added after a checkpoint was written (absent from its manifest) count as their
// defaults: loading it warns only about options that really differ.
TEST(MuonAuto, OptionsAbsentFromAnOlderCheckpointCountAsDefaults) {
  const Communicator& world = test::world();
  const int w = world.size();
  const TestLayout l{.label = "w", .m = 64, .n = 8, .gtp = w};
  MuonOptions o;
  o.tp_mode = TpMode::kAuto;
  Held a{make_process_groups(world, 1, w), Matrix(l.shard_rows(), l.n_tp())};
  const std::string dir = save_auto_checkpoint(o, a, l);
  if (world.rank() == 0) {  // as an older version wrote it: no plan, no wisdom
    const auto path = std::filesystem::path(dir) / "manifest.json";
    nlohmann::json manifest;
    {
      std::ifstream in(path);
      in >> manifest;
    }
    ASSERT_TRUE(manifest.at("config").at("options").contains("plan"));
    manifest["config"]["options"].erase("plan");
    manifest["config"]["options"].erase("wisdom");
    std::ofstream(path) << manifest.dump();
  }
  world.barrier();
  const auto load_log = [&](const MuonOptions& opts) {
    std::ostringstream out;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
    sink->set_pattern("%v");
    const auto previous = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
    Held b{make_process_groups(world, 1, w), Matrix::from(a.local.view())};
    Muon second(opts, world, cpu_compute());
    second.add_parameter(spec(l, b, false));
    second.load(dir);
    spdlog::set_default_logger(previous);
    return out.str();
  };
  EXPECT_EQ(load_log(o).find("other options"), std::string::npos);
  MuonOptions other = o;
  other.lr = 2 * o.lr;
  const std::string log = load_log(other);
  if (world.rank() == 0) {
    EXPECT_NE(log.find("other options"), std::string::npos) << log;
    EXPECT_NE(log.find("/lr"), std::string::npos) << log;
    EXPECT_EQ(log.find("/plan"), std::string::npos) << log;
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distmuon
