// `bench --model` when a timed candidate's reset (the copy of its input before a run) fails on one
// rank only: run under DISTMUON_FAULT=1:measure-reset (ctest sets it, at 2 and 4 ranks, and
// GTEST_FILTER picks one case per process: the fault fires once). The bench's rounds and its
// --plan measure planner share one runner (src/plan/candidate_runner.h), which agrees the reset's
// failure before any rank enters the candidate's collectives: every rank ends with the same
// error instead of waiting in a collective for the failing rank (a hang fails the test by its
// ctest timeout).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "distmuon/error.h"
#include "distmuon/model_bench.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::world;

ModelBenchConfig tiny_config() {
  ModelBenchConfig c;
  c.model = "tiny";
  c.weights = {{"a", 48, 32, 2, false}, {"b", 33, 16, 1, false}};
  c.modes = {TpMode::kDuplicated, TpMode::kDistributed};
  c.timing = {0, 2};
  c.profile = "h100";
  return c;
}

// Runs the bench expecting the reset fault on rank 1 to end every rank with `what`'s message.
void expect_agreed_reset_failure(const ModelBenchConfig& c, const std::string& what) {
  const char* fault = std::getenv("DISTMUON_FAULT");
  ASSERT_TRUE(fault != nullptr && std::string(fault) == "1:measure-reset")
      << "run with DISTMUON_FAULT=1:measure-reset (tests/bench/CMakeLists.txt)";
  ASSERT_GE(world().size(), 2);
  try {
    run_model_bench(world(), c, cpu_compute());
    ADD_FAILURE() << "the bench passed on rank " << world().rank();
  } catch (const CollectiveError& e) {
    const std::string msg = e.what();
    EXPECT_NE(
        msg.find(what + ": a timed run failed on rank(s) 1 of " + std::to_string(world().size())),
        std::string::npos)
        << msg;
    EXPECT_NE(msg.find("injected fault 'measure-reset' on rank 1"), std::string::npos) << msg;
  }
  // Every rank is still in step with the others.
  EXPECT_EQ(world().all_reduce<std::int32_t>(1), world().size());
}

// The bench's own interleaved rounds (auto planned by estimate): the first reset fails.
TEST(ModelBenchResetFault, TheBenchsRoundsEndEveryRankWithTheMessage) {
  expect_agreed_reset_failure(tiny_config(), "bench --model");
}

// --plan measure: the planner's first reset fails, before the bench's rounds.
TEST(ModelBenchResetFault, TheMeasuredPlanEndsEveryRankWithTheMessage) {
  ModelBenchConfig c = tiny_config();
  c.plan = PlanMode::kMeasure;
  c.measure.reps = 1;
  expect_agreed_reset_failure(c, "tp_mode=auto (measure)");
}

}  // namespace
}  // namespace distmuon
