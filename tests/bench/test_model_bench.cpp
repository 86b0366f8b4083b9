// The model benchmark's bookkeeping on tiny weights: one result per distinct shape and mode, the
// padded row sharding of training, auto's choice from the resolver, regrets and count-weighted
// totals that add up; refusals. Timings themselves are not asserted (the machine decides them).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/model_bench.h"
#include "distmuon/plots.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::world;

ModelBenchConfig tiny_config() {
  ModelBenchConfig c;
  c.model = "tiny";
  // 33 rows do not split evenly over 2 ranks: padded as training pads them. 48x32 appears twice.
  c.weights = {{"a", 48, 32, 2, false}, {"b", 33, 16, 1, false}, {"c", 48, 32, 1, false}};
  c.timing = {0, 2};
  c.profile = "h100";
  c.algorithm = NsAlgorithm::kAuto;  // both algorithms measured, either offered to auto
  return c;
}

// Totals within 1e-12 relative of sums of the same doubles in another order.
void expect_sum(double actual, double expected) {
  EXPECT_NEAR(actual, expected, 1e-12 * std::max(1e-30, std::abs(expected)));
}

// --pipeline 0 (the default): each owner run in the cost model's chunk count, as the optimizer
// chooses it: these four tiny weights on the h100 profile are latency-bound, so one chunk, and no
// serial run beside it (it would be the same schedule).
TEST(ModelBench, DefaultPipelineIsTheCostModelsChunkCount) {
  const Communicator& w = world();
  if (w.size() == 1) GTEST_SKIP() << "no owner runs on one rank";
  const ModelBenchReport r = run_model_bench(w, tiny_config(), cpu_compute());
  ASSERT_FALSE(r.owner.empty());
  for (const ModelBenchOwner& o : r.owner) {
    EXPECT_FALSE(o.serial) << o.label;
    EXPECT_EQ(o.chunks, 1) << o.label;
  }
}

TEST(ModelBench, OneRowPerShapeWithConsistentTotals) {
  const Communicator& w = world();
  ModelBenchConfig c = tiny_config();
  c.pipeline = 4;  // forced: the cost model would run these tiny weights in one chunk
  const ModelBenchReport r = run_model_bench(w, c, cpu_compute());
  EXPECT_EQ(r.group_size, w.size());
  EXPECT_EQ(r.profile, "h100");
  EXPECT_TRUE(r.has_profile);
  ASSERT_EQ(r.shapes.size(), 2u);
  EXPECT_EQ(r.shapes[0].count, 3);
  EXPECT_EQ(r.shapes[0].names, (std::vector<std::string>{"a", "c"}));
  const ModelBenchShape& odd = r.shapes[1];
  EXPECT_EQ(odd.shard_rows, (33 + w.size() - 1) / w.size());
  EXPECT_EQ(odd.pad, odd.shard_rows * w.size() - 33);

  double dup = 0, dist = 0, chosen = 0, oracle = 0, predicted_auto = 0;
  for (const ModelBenchShape& s : r.shapes) {
    SCOPED_TRACE(shape_str(s.m, s.n));
    // duplicated, distributed, blockwise, each with the standard and the Gram algorithm.
    ASSERT_EQ(s.modes.size(), 6u);
    for (const ModelBenchMode& m : s.modes) {
      EXPECT_EQ(m.time.samples_s.size(), 2u);
      EXPECT_GT(m.time.median_s, 0.0);
    }
    EXPECT_EQ(s.key.partition_dim, 0);
    EXPECT_EQ(s.key.group_size, w.size());
    EXPECT_EQ(s.key.elem_size, 4);
    EXPECT_EQ(s.key.algorithm, NsAlgorithm::kAuto);
    // Every rank reached the same plan (rank 0's, shared).
    const int code =
        static_cast<int>(s.auto_choice.mode) * 4 + static_cast<int>(s.auto_choice.algorithm);
    const auto codes = w.all_gather(code);
    EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [&](int c) { return c == codes[0]; }));
    if (r.auto_owner) {
      EXPECT_EQ(s.auto_choice.mode, TpMode::kOwner);
    } else {
      EXPECT_EQ(s.auto_choice, s.estimate.best());  // the same model and profile
    }
    double best = 0;
    bool first = true;
    for (const ModelBenchMode& m : s.modes) {
      if (m.mode == TpMode::kBlockwise) continue;
      best = first ? m.time.median_s : std::min(best, m.time.median_s);
      first = false;
    }
    EXPECT_EQ(s.median_s(s.fastest.mode, s.fastest.algorithm), best);
    EXPECT_NE(s.fastest.mode, TpMode::kBlockwise);
    dup += s.count * s.median_s(TpMode::kDuplicated);
    dist += s.count * s.median_s(TpMode::kDistributed);
    oracle += s.count * best;
    if (!r.auto_owner) {
      const double mine = s.median_s(s.auto_choice.mode, s.auto_choice.algorithm);
      EXPECT_DOUBLE_EQ(s.regret, mine / best - 1);
      EXPECT_GE(s.regret, 0.0);
      chosen += s.count * mine;
      predicted_auto += s.count * s.estimate.cost(s.auto_choice);
    }
  }
  expect_sum(r.totals.duplicated_s, dup);
  expect_sum(r.totals.distributed_s, dist);
  expect_sum(r.totals.per_weight_oracle_s, oracle);
  // Owner over the whole model with more than one rank: all standard, all Gram, auto's mix
  // when it planned owner with mixed algorithms (each pipelined), and the first again on the
  // serial schedule (last).
  if (w.size() == 1) {
    EXPECT_TRUE(r.owner.empty());
    EXPECT_FALSE(r.auto_owner);
  } else {
    EXPECT_GE(r.owner.size(), 3u);
    EXPECT_LE(r.owner.size(), 4u);
    EXPECT_TRUE(r.owner.back().serial);
    EXPECT_EQ(r.owner.back().algorithms, r.owner.front().algorithms);
    EXPECT_FALSE(r.owner.front().serial);
    for (const ModelBenchOwner& o : r.owner)
      EXPECT_EQ(o.chunks, o.serial ? 1 : 4) << o.label;
  }
  std::vector<NsAlgorithm> planned;
  for (const ModelBenchShape& s : r.shapes)
    planned.insert(planned.end(), static_cast<std::size_t>(s.count), s.auto_choice.algorithm);
  double all = oracle;
  int matches = 0;
  for (const ModelBenchOwner& o : r.owner) {
    EXPECT_EQ(o.algorithms.size(), 4u);  // 3 + 1 weights
    EXPECT_EQ(o.time.samples_s.size(), 2u);
    EXPECT_GT(o.predicted_s, 0.0);
    all = std::min(all, o.time.median_s);
    if (r.auto_owner && o.algorithms == planned && !o.serial) {
      chosen = o.time.median_s;
      predicted_auto = o.predicted_s;
      ++matches;
    }
  }
  EXPECT_EQ(matches, r.auto_owner ? 1 : 0);
  expect_sum(r.totals.oracle_s, all);
  expect_sum(r.totals.auto_s, chosen);
  expect_sum(r.totals.predicted_auto_s, predicted_auto);
  EXPECT_LE(r.totals.oracle_s, r.totals.duplicated_s);
  EXPECT_LE(r.totals.oracle_s, r.totals.distributed_s);
  EXPECT_GE(r.totals.auto_s, r.totals.oracle_s);

  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j.at("shapes").size(), 2u);
  EXPECT_TRUE(j.at("shapes")[0].at("measured").contains("blockwise"));
  EXPECT_TRUE(j.at("shapes")[0].at("measured").contains("distributed+gram"));
  EXPECT_TRUE(j.at("shapes")[0].at("model").contains("owner+gram"));
  EXPECT_EQ(j.at("owner").size(), r.owner.size());
  EXPECT_TRUE(j.at("totals").contains("predicted"));
  EXPECT_NE(format_report(r).find("oracle"), std::string::npos);
}

// A batched weight (two parameters of 2 matrices: a layer's experts) is one row of its own, timed
// and priced per parameter (its key's batch), its totals count parameters; owner mode and the
// replicated homes take its matrices one by one (one home per matrix).
TEST(ModelBench, BatchedWeightsAreTimedAndPricedPerParameter) {
  const Communicator& w = world();
  ModelBenchConfig c;
  c.model = "tiny-moe";
  c.weights = {{"expert", 48, 32, 4, true, 2}, {"dense", 48, 32, 1, false}};
  c.timing = {0, 1};
  c.profile = "h100";
  c.replicated = w.size() > 1;
  const ModelBenchReport r = run_model_bench(w, c, cpu_compute());
  ASSERT_EQ(r.shapes.size(), 2u);  // the same shape, batched and not: two rows
  const ModelBenchShape& e = r.shapes[0];
  EXPECT_EQ(e.batch, 2);
  EXPECT_EQ(e.parameters(), 2);
  EXPECT_EQ(e.key.batch, 2);
  EXPECT_FALSE(e.key.batched_products);  // the CPU runs each matrix's NS in turn
  const HardwareProfile h100 = resolve_profile("h100").value();
  EXPECT_EQ(e.estimate.duplicated.flops,
            estimate(e.key, &h100, CostModel::kRefined).duplicated.flops);
  EXPECT_EQ(r.shapes[1].batch, 1);
  double dup = 0, predicted = 0;
  for (const ModelBenchShape& s : r.shapes) {
    dup += static_cast<double>(s.parameters()) * s.median_s(TpMode::kDuplicated);
    predicted += static_cast<double>(s.parameters()) * s.estimate.duplicated.seconds();
  }
  expect_sum(r.totals.duplicated_s, dup);
  expect_sum(r.totals.predicted_duplicated_s, predicted);
  for (const ModelBenchOwner& o : r.owner) {
    EXPECT_EQ(o.algorithms.size(), 3u);  // one per parameter
    EXPECT_GT(o.predicted_s, 0.0);
  }
  if (r.replicated) {
    EXPECT_EQ(r.replicated->homes.size(), 5u);  // one per matrix
    EXPECT_GT(r.replicated->predicted_home_pipelined_s, 0.0);
  }
  EXPECT_EQ(to_json(r).at("shapes")[0].at("batch"), 2);
  EXPECT_NE(format_report(r).find("x2 expert 48x32"), std::string::npos);
}

// plan measure: auto's plan is the fastest of the planner's own times (each shape its fastest
// candidate, or owner when its run beats their count-weighted sum), and its predicted total is
// the planner's time of that plan.
TEST(ModelBench, MeasuredPlanFollowsThePlannersTimes) {
  const Communicator& w = world();
  ModelBenchConfig c = tiny_config();
  c.modes = {TpMode::kDuplicated, TpMode::kDistributed};
  c.plan = PlanMode::kMeasure;
  c.measure.reps = 1;
  const ModelBenchReport r = run_model_bench(w, c, cpu_compute());
  EXPECT_EQ(r.plan, PlanMode::kMeasure);
  EXPECT_GT(r.plan_timed_runs, 0u);
  double per_weight = 0;
  for (const ModelBenchShape& s : r.shapes) {
    SCOPED_TRACE(shape_str(s.m, s.n));
    ASSERT_FALSE(s.planned.empty());
    for (std::size_t i = 1; i < s.planned.size(); ++i)
      EXPECT_LE(s.planned[i - 1].seconds, s.planned[i].seconds);
    per_weight += static_cast<double>(s.count) * s.planned.front().seconds;
    if (!r.auto_owner) EXPECT_EQ(s.auto_choice, s.planned.front().choice);
  }
  if (r.auto_owner) {
    const auto it = std::find_if(r.owner.begin(), r.owner.end(),
                                 [](const ModelBenchOwner& o) { return o.planned_s > 0; });
    ASSERT_NE(it, r.owner.end());
    EXPECT_LT(r.totals.predicted_auto_s, per_weight);
  } else {
    expect_sum(r.totals.predicted_auto_s, per_weight);
  }
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j.at("plan"), "measure");
  EXPECT_TRUE(j.at("shapes")[0].contains("planned_ms"));
  EXPECT_NE(format_report(r).find("planned"), std::string::npos);
}

TEST(ModelBench, Refusals) {
  const Communicator& w = world();
  ModelBenchConfig c = tiny_config();
  c.max_elements = 32 * 32 - 1;  // 48x32's distributed Gram is 32 x 32
  try {
    run_model_bench(w, c, cpu_compute());
    FAIL() << "no throw";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("48x32"), std::string::npos) << e.what();
  }
  c = tiny_config();
  c.modes = {TpMode::kDuplicated};
  EXPECT_THROW(run_model_bench(w, c, cpu_compute()), CollectiveError);
  c = tiny_config();
  c.profile = "no-such-gpu";
  EXPECT_THROW(run_model_bench(w, c, cpu_compute()), CollectiveError);
  c = tiny_config();
  c.weights.clear();
  EXPECT_THROW(run_model_bench(w, c, cpu_compute()), CollectiveError);
  c = tiny_config();  // no timed round: refused with the others, before anything runs
  c.timing = {0, 0};
  EXPECT_THROW(run_model_bench(w, c, cpu_compute()), CollectiveError);
  c = tiny_config();  // auto would plan standard NS, which gram alone does not measure
  c.cost_model = "reference";
  c.algorithm = NsAlgorithm::kGram;
  EXPECT_THROW(run_model_bench(w, c, cpu_compute()), CollectiveError);
}

TEST(ModelBench, PlotIsWritten) {
  const Communicator& w = world();
  ModelBenchConfig c = tiny_config();
  c.timing = {0, 1};
  c.modes = {TpMode::kDuplicated, TpMode::kDistributed};
  c.algorithm = ModelBenchConfig{}.algorithm;  // the default: standard only, as Muon's default
  const ModelBenchReport r = run_model_bench(w, c, cpu_compute());
  for (const ModelBenchShape& s : r.shapes) {
    ASSERT_EQ(s.modes.size(), 2u);
    for (const ModelBenchMode& m : s.modes)
      EXPECT_EQ(m.algorithm, NsAlgorithm::kStandard);
    EXPECT_EQ(s.auto_choice.algorithm, NsAlgorithm::kStandard);
  }
  if (w.rank() != 0) return;
  const auto png = std::filesystem::temp_directory_path() /
                   fmt::format("distmuon-test-model-bench-{}.png", ::getpid());
  render_model_bench_plot(r, png);
  EXPECT_GT(std::filesystem::file_size(png), 1000u);
  std::filesystem::remove(png);
}

}  // namespace
}  // namespace distmuon
