// `distmuon plan`'s library side: grouping per shape, totals, JSON schema, the decision map.
#include <gtest/gtest.h>

#include <unistd.h>
#include "test_util.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "distmuon/plan.h"
#include "distmuon/plots.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<WeightShape> kWeights = {
    {"a", 4096, 1024, 2, false}, {"b", 4096, 1024, 3, false}, {"c", 1024, 4096, 1, false}};

TEST(Plan, GroupsByShapeAndSumsTotals) {
  PlanOptions o;
  o.profile = *find_profile("h100");
  const Plan plan = make_plan(kWeights, o);
  ASSERT_EQ(plan.rows.size(), 2u);
  EXPECT_EQ(plan.rows[0].count, 5);
  EXPECT_EQ(plan.rows[0].names, (std::vector<std::string>{"a", "b"}));
  const CostEstimate tall = estimate_refined(o.key(4096, 1024), &*o.profile);
  const CostEstimate wide = estimate_refined(o.key(1024, 4096), &*o.profile);
  EXPECT_DOUBLE_EQ(plan.total_duplicated,
                   5 * tall.duplicated.seconds() + wide.duplicated.seconds());
  EXPECT_DOUBLE_EQ(plan.total_distributed,
                   5 * tall.distributed.seconds() + wide.distributed.seconds());
  EXPECT_DOUBLE_EQ(plan.total_per_weight, 5 * tall.best_cost() + wide.best_cost());
  EXPECT_LE(plan.total_per_weight, std::min(plan.total_duplicated, plan.total_distributed));
  // Owner over the six weights: the estimate of the same keys; auto takes the cheaper.
  const std::vector<AutoKey> keys = {o.key(4096, 1024), o.key(4096, 1024), o.key(4096, 1024),
                                     o.key(4096, 1024), o.key(4096, 1024), o.key(1024, 4096)};
  const BucketPlan bucket = plan_bucket(keys, &*o.profile, CostModel::kRefined);
  ASSERT_TRUE(plan.owner.has_value());
  EXPECT_DOUBLE_EQ(plan.owner->cost(), bucket.owner->cost());
  EXPECT_EQ(plan.auto_owner, plan.owner->cost() < plan.total_per_weight);
  EXPECT_DOUBLE_EQ(plan.total_auto, std::min(plan.owner->cost(), plan.total_per_weight));
  const std::string text = format_plan(plan);
  EXPECT_NE(text.find("always duplicated"), std::string::npos);
  EXPECT_NE(text.find("always distributed"), std::string::npos);
  EXPECT_THROW(make_plan({}, o), Error);
}

TEST(Plan, JsonFollowsTheSchema) {
  PlanOptions o;
  o.algorithm = NsAlgorithm::kAuto;  // either algorithm: both are chosen somewhere
  o.group_size = 4;
  o.profile = *find_profile("gb200");
  const json j = make_plan(kWeights, o);
  ASSERT_EQ(j["weights"].size(), 2u);
  for (const auto& w : j["weights"]) {
    for (const char* key : {"m", "n", "count", "group_size", "mode", "cost"})
      EXPECT_TRUE(w.contains(key)) << key;
    EXPECT_EQ(w["group_size"], 4);
    EXPECT_TRUE(w["mode"] == "duplicated" || w["mode"] == "distributed");
    EXPECT_TRUE(w["algorithm"] == "standard" || w["algorithm"] == "gram");
    for (const char* c : {"duplicated+gram", "distributed+gram", "owner", "owner+gram"})
      EXPECT_GT(w["cost"][c].get<double>(), 0) << c;
    EXPECT_GT(w["cost"]["duplicated"].get<double>(), 0);
    EXPECT_GT(w["cost"]["distributed"].get<double>(), 0);
  }
  for (const char* key :
       {"duplicated", "distributed", "auto", "speedup_vs_duplicated", "speedup_vs_distributed"}) {
    EXPECT_TRUE(j["totals"].contains(key)) << key;
  }
  EXPECT_EQ(j["units"], "seconds");
  EXPECT_GE(j["totals"]["speedup_vs_duplicated"].get<double>(), 1.0);
}

// The default plans what Muon runs by default (standard NS); the reference model prices only
// standard NS, so it says so and refuses gram instead of printing it.
TEST(Plan, AlgorithmsFollowTheOptions) {
  PlanOptions o;
  o.profile = *find_profile("h100");
  for (const PlanRow& r : make_plan(kWeights, o).rows)
    EXPECT_EQ(r.estimate.algorithm, NsAlgorithm::kStandard);
  EXPECT_NE(o.describe().find("NS standard"), std::string::npos) << o.describe();
  o.model = CostModel::kReference;
  o.algorithm = NsAlgorithm::kAuto;
  EXPECT_NE(o.describe().find("NS standard"), std::string::npos) << o.describe();
  o.algorithm = NsAlgorithm::kGram;
  EXPECT_THROW(make_plan(kWeights, o), Error);
}

TEST(Plan, WithoutProfileCostsAreFlops) {
  PlanOptions o;  // no profile
  const json j = make_plan(kWeights, o);
  EXPECT_EQ(j["units"], "flops");
  EXPECT_EQ(j["weights"][0]["cost"]["duplicated"].get<double>(), ns_flops(4096, 1024, 5, true));
}

TEST(Plan, DecisionMapIsDrawnByGnuplot) {
  const fs::path png =
      fs::temp_directory_path() / ("distmuon-test-map-" + std::to_string(getpid()) + ".png");
  PlanOptions o;
  o.profile = *find_profile("gb200");
  const char* path = std::getenv("PATH");
  const std::string saved = path != nullptr ? path : "";
  // Without gnuplot on PATH the error says what is missing.
  setenv("PATH", "/nonexistent-distmuon-path", 1);
  try {
    render_decision_map(o, kWeights, png);
    ADD_FAILURE() << "no throw without gnuplot";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gnuplot"), std::string::npos) << e.what();
  }
  setenv("PATH", saved.c_str(), 1);
  if (system("command -v gnuplot > /dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot not installed";
  render_decision_map(o, kWeights, png);
  EXPECT_TRUE(test::is_png_file(png));
  fs::remove(png);
}

}  // namespace
}  // namespace distmuon
