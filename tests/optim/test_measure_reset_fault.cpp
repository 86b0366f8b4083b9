// plan=measure when a candidate's reset (the copy of its weights before a timed run) fails on one
// rank only: run under DISTMUON_FAULT=1:measure-reset (ctest sets it, at 2 and 4 ranks). The
// failure is agreed before any rank enters the candidate's collectives, so every rank ends the
// first step with the same error instead of waiting in a TP collective for the failing rank (a
// hang fails the test by its ctest timeout).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "distmuon/error.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

TEST(MeasureResetFault, AResetFailingOnOneRankEndsEveryRankWithItsMessage) {
  const Communicator& world = test::world();
  const char* fault = std::getenv("DISTMUON_FAULT");
  ASSERT_TRUE(fault != nullptr && std::string(fault) == "1:measure-reset")
      << "run with DISTMUON_FAULT=1:measure-reset (tests/optim/CMakeLists.txt)";
  ASSERT_GE(world.size(), 2);
  // One weight split by columns over the world: every candidate (duplicated, distributed, owner)
  // runs collectives over the TP group, which holds the failing rank.
  const test::TestLayout l{.label = "wide", .m = 48, .n = 128, .tp_dim = 1, .tp = world.size()};
  const ProcessGroups tp = make_process_groups(world, world.size(), 1);
  MuonOptions o;
  o.tp_mode = TpMode::kAuto;
  o.ns_algorithm = NsAlgorithm::kAuto;
  o.plan = PlanMode::kMeasure;
  Muon opt(o, world, cpu_compute());
  Matrix param = test::shard_for(test::random_matrix(l.m, l.n, 1).view(), l, tp.tp.rank(), 0);
  const Matrix before = param;
  const Matrix grad = test::shard_for(test::random_matrix(l.m, l.n, 2).view(), l, tp.tp.rank(), 0);
  opt.add_parameter(test::layout_spec(l, tp, param.view(), l.label));
  const std::vector<ConstMatrixView> grads = {grad.view()};
  try {
    opt.step(grads);
    ADD_FAILURE() << "the step passed on rank " << world.rank();
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tp_mode=auto (measure): a timed run failed on rank(s) 1 of " +
                        std::to_string(world.size())),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("injected fault 'measure-reset' on rank 1"), std::string::npos) << what;
  }
  // Nothing was updated, and every rank is still in step with the others.
  EXPECT_TRUE(std::equal(param.values().begin(), param.values().end(), before.values().begin()));
  EXPECT_EQ(world.all_reduce<std::int32_t>(1), world.size());
}

}  // namespace
}  // namespace distmuon
