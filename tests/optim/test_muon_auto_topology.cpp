// tp_mode=auto on a TP 2 x GTP 2 weight whose groups cross NVLink domains unevenly, from the
// topology file tests/optim/data/topology_tp_groups_split.json (ranks 0, 1, 3 in domain A, rank 2
// in B; ctest passes it in DISTMUON_TOPOLOGY_FILE). The GTP group {0, 2} crosses, {1, 3} does
// not; the TP group {2, 3} crosses, {0, 1} does not. So the two ranks of each TP group disagree
// on whether their GTP group crosses: the weight's key must still say it crosses on every rank.
//
// Tolerance 1e-5 relative: auto runs duplicated or distributed; both are the Newton-Schulz of the
// full matrix, distributed with the Gram matrix summed over the group in another order (fp32
// rounding, see test_muon_layouts).
#include <gtest/gtest.h>

#include <cstdlib>

#include "distmuon/topology.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

using test::TestLayout;

// Three steps of one optimizer over the weight laid out as l; returns this rank's shard and the
// optimizer's decisions.
struct Result {
  Matrix shard;
  std::optional<TpMode> mode;
  std::map<AutoKey, AutoChoice> decisions;
};

Result run(const TestLayout& l, TpMode mode) {
  const Communicator& world = test::world();
  const ProcessGroups groups = make_process_groups(world, l.tp, l.gtp);
  MuonOptions o;
  o.lr = 1.0;
  o.tp_mode = mode;
  o.cost_model = "reference";
  Muon opt(o, world, cpu_compute());
  Result r{Matrix(l.shard_rows(), l.n_tp()), {}, {}};
  opt.add_parameter(test::layout_spec(l, groups, r.shard.view(), l.label));
  for (int step = 0; step < 3; ++step) {
    const Matrix full = test::random_matrix(l.m, l.n, 7 + static_cast<std::uint64_t>(step));
    const Matrix g = test::shard_for(full.view(), l, groups.tp.rank(), groups.gtp.rank(), 3.0f);
    const ConstMatrixView grads[] = {g.view()};
    opt.step(grads);
  }
  r.mode = opt.parameters()[0].mode;
  r.decisions = opt.auto_decisions();
  return r;
}

TEST(MuonAutoTopology, TpGroupWhoseGtpGroupsDifferOnCrossingDoesNotHang) {
  const Communicator& world = test::world();
  if (world.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const char* file = std::getenv("DISTMUON_TOPOLOGY_FILE");
  ASSERT_NE(file, nullptr) << "ctest sets DISTMUON_TOPOLOGY_FILE to the fixture";
  const Topology topology = Topology::gather(world);
  ASSERT_EQ(topology.domains()[static_cast<std::size_t>(world.rank())].source, "file");

  // The fixture does what this test is about: within each TP group, one rank's GTP group
  // crosses a domain and the other's does not.
  const ProcessGroups groups = make_process_groups(world, 2, 2);
  const auto gtp_crosses = groups.tp.all_gather<std::int32_t>(topology.crosses(groups.gtp) ? 1 : 0);
  ASSERT_NE(gtp_crosses[0], gtp_crosses[1]);

  for (const int dim : {0, 1}) {
    const TestLayout l{.label = "tp2 x gtp2", .m = 64, .n = 16, .tp_dim = dim, .tp = 2, .gtp = 2};
    const Result autos = run(l, TpMode::kAuto);
    const Result dup = run(l, TpMode::kDuplicated);
    ASSERT_TRUE(autos.mode.has_value());
    EXPECT_LE(relative_error(autos.shard.view(), dup.shard.view()), 1e-5) << "dim " << dim;
    // The weight spans both domains: its key says so on every rank.
    ASSERT_EQ(autos.decisions.size(), 1u);
    EXPECT_TRUE(autos.decisions.begin()->first.crosses_domain) << "dim " << dim;
  }
}

}  // namespace
}  // namespace distmuon
