// tp_mode=auto: one evaluation per key, one decision for the whole group even when the ranks'
// profiles differ, errors raised on every rank, and the info log line.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>

#include "distmuon/auto_mode.h"
#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon {
namespace {

AutoKey key(Index m, Index n, bool crosses = false) {
  return AutoKey{
      .m = m, .n = n, .group_size = 8, .crosses_domain = crosses, .steps = 5, .elem_size = 2};
}

TEST(AutoMode, CacheEvaluatesOncePerKey) {
  const Communicator& world = test::world();
  auto stats = std::make_shared<CommStats>();
  const Communicator group = counting_communicator(world, stats);
  AutoModeResolver resolver("h100", "refined");
  const AutoKey a = key(4096, 1024), b = key(1024, 4096);
  const AutoChoice first = resolver.resolve(a, group);
  EXPECT_EQ(resolver.resolve(a, group), first);
  resolver.resolve(b, group);
  EXPECT_EQ(resolver.resolve(a, group), first);
  EXPECT_EQ(resolver.model_evaluations(),
            world.rank() == 0 ? 2u : 0u);  // only the group's rank 0 evaluates
  EXPECT_EQ(stats->broadcast.calls, 2u);   // one decision broadcast per key
  EXPECT_EQ(resolver.decisions().size(), 2u);
  EXPECT_EQ(resolver.decisions().at(a), first);
  EXPECT_EQ(first, estimate_refined(a, &*resolver.profile()).best());
}

// Rank 0 plans without a profile (a crossing group -> duplicated), the others with gb200 (which
// prefers distributed for this tall weight across domains), and the other way round: every rank
// follows its group's rank 0.
TEST(AutoMode, RanksAgreeDespiteDifferentLocalProfiles) {
  const Communicator& world = test::world();
  const AutoKey k = key(57344, 8192, /*crosses=*/true);
  const HardwareProfile gb200 = *find_profile("gb200");
  ASSERT_EQ(estimate_refined(k, nullptr).choice, TpMode::kDuplicated);
  ASSERT_EQ(estimate_refined(k, &gb200).choice,
            TpMode::kDistributed);  // so the local choices do differ
  for (const bool root_has_profile : {false, true}) {
    const bool mine = (world.rank() == 0) == root_has_profile;
    AutoModeResolver resolver(mine ? "gb200" : "none", "refined");
    const TpMode mode = resolver.resolve(k, world).mode;
    const auto all = world.all_gather<std::int32_t>(static_cast<std::int32_t>(mode));
    for (const auto m : all)
      EXPECT_EQ(m, all[0]);
    EXPECT_EQ(mode, root_has_profile ? TpMode::kDistributed : TpMode::kDuplicated);
  }
}

TEST(AutoMode, ModelErrorOnRootThrowsOnEveryRank) {
  AutoModeResolver resolver("none", "reference");
  EXPECT_THROW(resolver.resolve(key(0, 16), test::world()), CollectiveError);
  EXPECT_TRUE(resolver.decisions().empty());
}

TEST(AutoMode, DifferentKeysAcrossRanksAreDetected) {
  const Communicator& world = test::world();
  if (world.size() == 1) GTEST_SKIP() << "needs two ranks";
  AutoModeResolver resolver;
  AutoKey k = key(4096, 1024);
  if (world.rank() == 1) k.steps = 6;
  try {
    resolver.resolve(k, world);
    FAIL() << "no throw";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
}

// A key cached on rank 0 and a new one on the others: the ranks agree before any rank uses its
// cache, so every rank throws instead of rank 0 returning and the others waiting (a hang).
TEST(AutoMode, AKeyCachedOnSomeRanksOnlyStillFailsOnEveryRank) {
  const Communicator& world = test::world();
  if (world.size() == 1) GTEST_SKIP() << "needs two ranks";
  AutoModeResolver resolver;
  const AutoKey cached = key(4096, 1024);
  const AutoChoice first = resolver.resolve(cached, world);
  try {
    resolver.resolve(world.rank() == 0 ? cached : key(6144, 1024), world);
    FAIL() << "no throw on rank " << world.rank();
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("tp_mode=auto"), std::string::npos) << e.what();
  }
  EXPECT_EQ(resolver.resolve(cached, world), first);  // the group still works
}

TEST(AutoMode, RestoredDecisionsNeedNoEvaluation) {
  auto stats = std::make_shared<CommStats>();
  const Communicator group = counting_communicator(test::world(), stats);
  AutoModeResolver resolver;
  resolver.restore(key(4096, 1024), {TpMode::kDistributed, NsAlgorithm::kGram});
  EXPECT_EQ(resolver.resolve(key(4096, 1024), group),
            (AutoChoice{TpMode::kDistributed, NsAlgorithm::kGram}));
  EXPECT_EQ(resolver.model_evaluations(), 0u);
  EXPECT_EQ(stats->broadcast.calls, 0u);
  EXPECT_THROW(resolver.restore(key(1, 1), {TpMode::kAuto}), Error);
  EXPECT_THROW(resolver.restore(key(1, 1), {TpMode::kOwner, NsAlgorithm::kAuto}), Error);
}

TEST(AutoMode, InvalidSpecsListTheValidValues) {
  try {
    AutoModeResolver r("none", "fastest");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refined"), std::string::npos);
  }
  EXPECT_THROW(AutoModeResolver("no-such-gpu"), Error);
}

TEST(AutoMode, LogsEachDecisionOnceWithItsEstimates) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  sink->set_pattern("%v");
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  spdlog::set_level(spdlog::level::info);
  AutoModeResolver resolver("gb200");
  const AutoChoice mode = resolver.resolve(key(4096, 1024), test::world());
  resolver.resolve(key(4096, 1024), test::world());
  spdlog::set_default_logger(previous);
  const std::string log = out.str();
  if (test::world().rank() != 0) {
    EXPECT_EQ(log, "");
    return;
  }
  const std::string expected = std::string("tp_mode=auto: 4096x1024 G=8 intra-domain -> ") +
                               to_string(mode) + " (duplicated ";
  EXPECT_EQ(log.find(expected), 0u) << log;
  EXPECT_NE(log.find(", distributed "), std::string::npos) << log;
  EXPECT_EQ(log.find("tp_mode=auto", 1), std::string::npos) << "logged twice: " << log;
}

}  // namespace
}  // namespace distmuon
