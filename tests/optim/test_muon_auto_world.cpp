// tp_mode=auto's NVLink-domain topology is gathered over the optimizer's world (docs/cost-model.md,
// "NVLink domains"):
//  - a topology file is read with each rank's rank in the optimizer's world, which need not be
//    MPI's: here MPI's world with its ranks rotated by one (world rank w = MPI rank + 1 mod size).
//    With the file's domains A, A, B, B over that world's ranks (4 ranks), a weight over the TP
//    groups {0,1}, {2,3} does not cross a domain and one also over the GTP groups {0,2}, {1,3}
//    does;
//  - a probe failing on one rank (a file without rank 3's entry, TP 2 x GTP 2 at 4 ranks) fails
//    every rank with the same error, agreed over the world: no rank waits in a group's collective.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distmuon/agreement.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using test::TestLayout;

// A topology file of this process (every rank writes its own) with the domains of the ranks
// listed; removed, with DISTMUON_TOPOLOGY_FILE, at the end of the scope.
class TopologyFile {
 public:
  TopologyFile(const std::string& name, const std::vector<std::string>& domains)
      : path_(fs::temp_directory_path() /
              ("distmuon-auto-world-" + std::to_string(::getpid()) + "-" + name + ".json")) {
    nlohmann::json ranks = nlohmann::json::array();
    for (std::size_t r = 0; r < domains.size(); ++r)
      ranks.push_back({{"rank", r}, {"domain", domains[r]}});
    std::ofstream(path_) << nlohmann::json{{"ranks", ranks}}.dump();
    EXPECT_EQ(::setenv("DISTMUON_TOPOLOGY_FILE", path_.c_str(), 1), 0);
  }
  ~TopologyFile() {
    ::unsetenv("DISTMUON_TOPOLOGY_FILE");
    fs::remove(path_);
  }
  TopologyFile(const TopologyFile&) = delete;
  TopologyFile& operator=(const TopologyFile&) = delete;

 private:
  fs::path path_;
};

std::string domain_of(int rank) {
  return rank < 2 ? "A" : "B";
}

// One step of an auto optimizer over world with the weights laid out as given (one optimizer,
// each weight with its own groups); returns the optimizer's view of them.
std::vector<ParamInfo> plan(const Communicator& world, const std::vector<TestLayout>& layouts) {
  MuonOptions o;
  o.tp_mode = TpMode::kAuto;
  o.cost_model = "reference";
  Muon opt(o, world, cpu_compute());
  std::vector<ProcessGroups> groups;
  std::vector<Matrix> shards, grads;
  groups.reserve(layouts.size());
  shards.reserve(layouts.size());
  for (const TestLayout& l : layouts) {
    groups.push_back(make_process_groups(world, l.tp, l.gtp));
    shards.emplace_back(l.shard_rows(), l.n_tp());
    opt.add_parameter(test::layout_spec(l, groups.back(), shards.back().view(), l.label));
    const Matrix full = test::random_matrix(l.m, l.n, 3);
    grads.push_back(
        test::shard_for(full.view(), l, groups.back().tp.rank(), groups.back().gtp.rank(), 0.0f));
  }
  std::vector<ConstMatrixView> views;
  for (const Matrix& g : grads)
    views.push_back(g.view());
  opt.step(views);
  return opt.parameters();
}

TEST(MuonAutoWorld, TheFileIsReadWithTheOptimizersWorldRanks) {
  const Communicator& mpi = test::world();
  const int n = mpi.size();
  const Communicator world = mpi.split(0, (mpi.rank() + 1) % n);
  ASSERT_EQ(world.rank(), (mpi.rank() + 1) % n);
  std::vector<std::string> domains;
  for (int r = 0; r < n; ++r)
    domains.push_back(domain_of(r));
  const TopologyFile file("rotated", domains);
  // TP over pairs of world ranks ({0,1}, {2,3}); the same with GTP over {0,2}, {1,3} at 4 ranks.
  const int t = n >= 2 ? 2 : 1, g = n / t;
  const std::vector<TestLayout> layouts = {
      {.label = "tp", .m = 64, .n = 8, .tp_dim = 0, .tp = t},
      {.label = "tp x gtp", .m = 32, .n = 16, .tp_dim = 1, .tp = t, .gtp = g}};
  const std::vector<ParamInfo> info = plan(world, layouts);
  ASSERT_EQ(info.size(), 2u);
  if (n == 1) {
    // A single rank: no group, nothing to plan.
    return;
  }
  ASSERT_TRUE(info[0].crosses_domain.has_value());
  ASSERT_TRUE(info[1].crosses_domain.has_value());
  EXPECT_FALSE(*info[0].crosses_domain)
      << "TP group of world ranks " << world.rank() / 2 * 2 << "," << world.rank() / 2 * 2 + 1;
  EXPECT_EQ(*info[1].crosses_domain, n == 4) << "GTP groups {0,2}, {1,3}";
}

TEST(MuonAutoWorld, AProbeFailingOnOneRankFailsTheWholeWorld) {
  const Communicator& world = test::world();
  const int n = world.size();
  if (n == 1) GTEST_SKIP() << "needs a group";
  // Every entry but the last rank's.
  std::vector<std::string> domains(static_cast<std::size_t>(n - 1), "A");
  const TopologyFile file("missing", domains);
  const int t = n == 4 ? 2 : 1, g = n / t;
  const TestLayout l{
      .label = "w", .m = 16, .n = 16, .tp_dim = t > 1 ? 1 : kNoPartition, .tp = t, .gtp = g};
  std::string what;
  try {
    plan(world, {l});
    ADD_FAILURE() << "no error";
  } catch (const CollectiveError& e) {
    what = e.what();
    EXPECT_TRUE(e.scope().is_world()) << e.scope().describe();
    EXPECT_EQ(e.scope().size, n);
  }
  EXPECT_NE(what.find(fmt::format("tp_mode=auto: NVLink-domain probe failed on rank(s) {} of {}",
                                  n - 1, n)),
            std::string::npos)
      << what;
  EXPECT_NE(what.find(fmt::format("no entry for rank {}", n - 1)), std::string::npos) << what;
  // Every rank has the same error (a CollectiveError on each rank when they differ).
  agree_on(world, what, "the probe's error");
}

}  // namespace
}  // namespace distmuon
