// NVLink-domain topology: environment and file overrides under mpirun, the NVML-less host-name
// fallback, and Topology::crosses on sub-groups (np 4: ranks 0-1 in domain A and 2-3 in B, so
// {0,1} is intra-domain and {0,2} crosses), also when the world is not MPI's (its ranks
// renumbered).
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "distmuon/topology.h"
#include "test_util.h"
#include "topology/nvml_fabric.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kMissingNvml = "libdistmuon-test-no-such-nvml.so.1";

// Clears the overrides before and after each test.
class TopologyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The host-name fallback is logged once per process; only rank 0 of a test prints.
    if (test::world().rank() != 0) spdlog::set_level(spdlog::level::warn);
    clear();
  }
  void TearDown() override { clear(); }
  static void clear() {
    unsetenv("DISTMUON_NVLINK_DOMAIN");
    unsetenv("DISTMUON_TOPOLOGY_FILE");
  }
  // A per-process file (all ranks share /tmp).
  static fs::path write(const std::string& name, const json& j) {
    const fs::path p = fs::temp_directory_path() /
                       ("distmuon-test-topo-" + std::to_string(getpid()) + "-" + name + ".json");
    std::ofstream(p) << j.dump();
    return p;
  }
};

std::string domain_of(int rank) {
  return rank < 2 ? "A" : "B";
}

std::string host() {
  char buf[HOST_NAME_MAX + 1] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

TEST_F(TopologyTest, EnvironmentOverrideSplitsTheWorld) {
  const Communicator& world = test::world();
  setenv("DISTMUON_NVLINK_DOMAIN", domain_of(world.rank()).c_str(), 1);
  EXPECT_EQ(probe_domain(world.rank()), (DomainInfo{domain_of(world.rank()), "env"}));
  const Topology topology = Topology::gather(world);
  const Communicator pairs = world.split(world.rank() / 2, world.rank());    // {0,1}, {2,3}
  const Communicator strided = world.split(world.rank() % 2, world.rank());  // {0,2}, {1,3}
  EXPECT_FALSE(topology.crosses(pairs));
  EXPECT_EQ(topology.crosses(strided), world.size() == 4);
  EXPECT_EQ(topology.crosses(world), world.size() > 2);
  EXPECT_EQ(topology.crosses_world(), world.size() > 2);
  const auto& all = topology.domains();
  ASSERT_EQ(all.size(), static_cast<std::size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r)
    EXPECT_EQ(all[static_cast<std::size_t>(r)], (DomainInfo{domain_of(r), "env"}));
  EXPECT_EQ(all, gather_domains(world, probe_domain(world.rank())));
}

TEST_F(TopologyTest, FileOverrideMapsRanksToDomains) {
  const Communicator& world = test::world();
  json ranks = json::array();
  for (int r = 0; r < world.size(); ++r)
    ranks.push_back({{"rank", r}, {"domain", domain_of(r)}});
  const fs::path file = write("map", {{"ranks", ranks}});
  setenv("DISTMUON_TOPOLOGY_FILE", file.c_str(), 1);
  EXPECT_EQ(probe_domain(world.rank()), (DomainInfo{domain_of(world.rank()), "file"}));
  const Communicator strided = world.split(world.rank() % 2, world.rank());
  EXPECT_EQ(Topology::gather(world).crosses(strided), world.size() == 4);
  // The environment variable wins over the file.
  setenv("DISTMUON_NVLINK_DOMAIN", "Z", 1);
  const Topology z = Topology::gather(world);
  EXPECT_EQ(z.domains()[static_cast<std::size_t>(world.rank())], (DomainInfo{"Z", "env"}));
  EXPECT_FALSE(z.crosses(world));
  EXPECT_FALSE(z.crosses(strided));
  fs::remove(file);
}

// The file's ranks are those of the world the topology is gathered over, not MPI's: a world whose
// ranks are MPI's rotated by one (world rank w = MPI rank + 1 mod size) reads its own entries, and
// its groups' ranks in it come from the communicators. With the file's domains A, A, B, B over
// that world's ranks, its pairs {0,1}, {2,3} do not cross and its {0,2}, {1,3} do.
TEST_F(TopologyTest, TheFileIsReadWithTheRanksOfTheGatheringWorld) {
  const Communicator& mpi = test::world();
  const int n = mpi.size();
  const Communicator world = mpi.split(0, (mpi.rank() + 1) % n);
  ASSERT_EQ(world.rank(), (mpi.rank() + 1) % n);
  json ranks = json::array();
  for (int r = 0; r < n; ++r)
    ranks.push_back({{"rank", r}, {"domain", domain_of(r)}});
  const fs::path file = write("rotated", {{"ranks", ranks}});
  setenv("DISTMUON_TOPOLOGY_FILE", file.c_str(), 1);
  const Topology topology = Topology::gather(world);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(topology.domains()[static_cast<std::size_t>(r)], (DomainInfo{domain_of(r), "file"}));
  const Communicator pairs = world.split(world.rank() / 2, world.rank());
  const Communicator strided = world.split(world.rank() % 2, world.rank());
  const std::vector<int> pair_ranks = pairs.ranks_in(world);
  ASSERT_EQ(pair_ranks.size(), static_cast<std::size_t>(pairs.size()));
  for (int r = 0; r < pairs.size(); ++r)
    EXPECT_EQ(pair_ranks[static_cast<std::size_t>(r)], (world.rank() / 2) * 2 + r);
  EXPECT_FALSE(topology.crosses(pairs));
  EXPECT_EQ(topology.crosses(strided), n == 4);
  EXPECT_EQ(topology.crosses_world(), n > 2);
  fs::remove(file);
}

TEST_F(TopologyTest, MalformedFilesNameTheField) {
  const auto error_of = [&](const json& j) {
    const fs::path file = write("bad", j);
    setenv("DISTMUON_TOPOLOGY_FILE", file.c_str(), 1);
    std::string what = "(no error)";
    try {
      probe_domain(0);
    } catch (const Error& e) {
      what = e.what();
    }
    fs::remove(file);
    return what;
  };
  EXPECT_NE(error_of({{"domains", json::array()}}).find("'ranks'"), std::string::npos);
  EXPECT_NE(error_of({{"ranks", {{{"rank", 0}}}}}).find("'ranks[0].domain'"), std::string::npos);
  EXPECT_NE(error_of({{"ranks", {{{"rank", "zero"}, {"domain", "A"}}}}}).find("'ranks[0].rank'"),
            std::string::npos);
  EXPECT_NE(error_of({{"ranks", {{{"rank", 1}, {"domain", "A"}}}}}).find("no entry for rank 0"),
            std::string::npos);
}

// One rank with a broken override must not hang the others: every rank gets the error, agreed
// over the world.
TEST_F(TopologyTest, AProbeFailingOnOneRankFailsEveryRank) {
  const Communicator& world = test::world();
  if (world.size() == 1) GTEST_SKIP() << "needs two ranks";
  if (world.rank() == 1) {
    setenv("DISTMUON_TOPOLOGY_FILE", "/nonexistent/distmuon-topology.json", 1);
  } else {
    setenv("DISTMUON_NVLINK_DOMAIN", "A", 1);
  }
  try {
    Topology::gather(world);
    FAIL() << "no throw";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("distmuon-topology.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NVLink-domain probe failed on rank(s) 1 of"),
              std::string::npos)
        << e.what();
    EXPECT_TRUE(e.scope().is_world()) << e.scope().describe();
  }
}

TEST_F(TopologyTest, WithoutNvmlTheHostNameIsTheDomain) {
  std::string reason;
  EXPECT_EQ(detail::nvml_fabric_domain(kMissingNvml, 0, &reason), "");
  EXPECT_NE(reason.find(kMissingNvml), std::string::npos) << reason;

  TopologyProbeOptions opts;
  opts.nvml_library = kMissingNvml;
  EXPECT_EQ(probe_domain(test::world().rank(), opts), (DomainInfo{host(), "hostname"}));
  // The default probe: NVML when a GPU fabric is there, else the same host-name fallback. All
  // ranks of a ctest run share one host (and one node's GPUs), so the world does not cross.
  const Topology topology = Topology::gather(test::world());
  const DomainInfo& mine = topology.domains()[static_cast<std::size_t>(test::world().rank())];
  EXPECT_TRUE(mine.source == "nvml" || mine == (DomainInfo{host(), "hostname"}))
      << mine.id << " " << mine.source;
  EXPECT_FALSE(topology.crosses(test::world()));
  EXPECT_FALSE(topology.crosses_world());
}

}  // namespace
}  // namespace distmuon
