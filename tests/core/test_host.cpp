// node_local_rank (core/host.h): which launcher's variable wins when several are set.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "core/host.h"

namespace distmuon {
namespace {

constexpr const char* kVars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK",
                                 "SLURM_LOCALID"};

// Sets exactly the given launcher variables for one call of node_local_rank, then restores them.
int local_rank_with(const std::map<std::string, std::string>& vars) {
  std::map<std::string, std::optional<std::string>> saved;
  for (const char* v : kVars) {
    const char* old = std::getenv(v);
    saved[v] = old != nullptr ? std::optional<std::string>(old) : std::nullopt;
    unsetenv(v);
  }
  for (const auto& [k, v] : vars)
    setenv(k.c_str(), v.c_str(), 1);
  const int r = detail::node_local_rank();
  for (const auto& [k, v] : saved) {
    if (v)
      setenv(k.c_str(), v->c_str(), 1);
    else
      unsetenv(k.c_str());
  }
  return r;
}

TEST(NodeLocalRank, TorchrunUnderSrunUsesTheWorkersLocalRank) {
  // srun starts one torchrun agent per node (SLURM_LOCALID 0); its workers have LOCAL_RANK.
  EXPECT_EQ(local_rank_with({{"SLURM_LOCALID", "0"}, {"LOCAL_RANK", "3"}}), 3);
  EXPECT_EQ(local_rank_with({{"SLURM_LOCALID", "2"}}), 2);
  EXPECT_EQ(local_rank_with({{"LOCAL_RANK", "5"}}), 5);
  // mpirun's own rank wins over anything inherited from an outer launcher.
  EXPECT_EQ(local_rank_with(
                {{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"LOCAL_RANK", "4"}, {"SLURM_LOCALID", "0"}}),
            1);
  EXPECT_EQ(local_rank_with({}), 0);
}

}  // namespace
}  // namespace distmuon
