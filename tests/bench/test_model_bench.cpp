// The model benchmark's bookkeeping on tiny weights: one result per distinct shape and mode, the
// padded row sharding of training, auto's choice from the resolver, regrets and count-weighted
// totals that add up; refusals. Timings themselves are not asserted (the machine decides them).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "distmuon/error.h"
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
  return c;
}

// Totals within 1e-12 relative of sums of the same doubles in another order.
void expect_sum(double actual, double expected) {
  EXPECT_NEAR(actual, expected, 1e-12 * std::max(1e-30, std::abs(expected)));
}

TEST(ModelBench, OneRowPerShapeWithConsistentTotals) {
  const Communicator& w = world();
  const ModelBenchConfig c = tiny_config();
  const ModelBenchReport r = run_model_bench(w, c);
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
    ASSERT_EQ(s.modes.size(), 3u);  // duplicated, distributed, blockwise
    for (const ModelBenchMode& m : s.modes) {
      EXPECT_EQ(m.time.samples_s.size(), 2u);
      EXPECT_GT(m.time.median_s, 0.0);
    }
    EXPECT_EQ(s.key.partition_dim, 0);
    EXPECT_EQ(s.key.group_size, w.size());
    EXPECT_EQ(s.key.elem_size, 4);
    // Every rank reached the same decision (the resolver broadcasts rank 0's).
    const auto modes = w.all_gather(static_cast<int>(s.auto_mode));
    EXPECT_TRUE(std::all_of(modes.begin(), modes.end(), [&](int m) { return m == modes[0]; }));
    EXPECT_EQ(s.auto_mode, s.estimate.choice);  // the same model and profile
    const double d = s.median_s(TpMode::kDuplicated), t = s.median_s(TpMode::kDistributed);
    EXPECT_EQ(s.median_s(s.fastest), std::min(d, t));
    EXPECT_DOUBLE_EQ(s.regret, s.median_s(s.auto_mode) / std::min(d, t) - 1);
    EXPECT_GE(s.regret, 0.0);
    dup += s.count * d;
    dist += s.count * t;
    chosen += s.count * s.median_s(s.auto_mode);
    oracle += s.count * std::min(d, t);
    predicted_auto += s.count * s.estimate.cost(s.auto_mode);
  }
  expect_sum(r.totals.duplicated_s, dup);
  expect_sum(r.totals.distributed_s, dist);
  expect_sum(r.totals.auto_s, chosen);
  expect_sum(r.totals.oracle_s, oracle);
  expect_sum(r.totals.predicted_auto_s, predicted_auto);
  EXPECT_LE(r.totals.oracle_s, r.totals.duplicated_s);
  EXPECT_LE(r.totals.oracle_s, r.totals.distributed_s);
  EXPECT_GE(r.totals.auto_s, r.totals.oracle_s);

  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j.at("shapes").size(), 2u);
  EXPECT_TRUE(j.at("shapes")[0].at("measured").contains("blockwise"));
  EXPECT_TRUE(j.at("totals").contains("predicted"));
  EXPECT_NE(format_report(r).find("oracle"), std::string::npos);
}

TEST(ModelBench, Refusals) {
  const Communicator& w = world();
  ModelBenchConfig c = tiny_config();
  c.max_elements = 32 * 32 - 1;  // 48x32's distributed Gram is 32 x 32
  try {
    run_model_bench(w, c);
    FAIL() << "no throw";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("48x32"), std::string::npos) << e.what();
  }
  c = tiny_config();
  c.modes = {TpMode::kDuplicated};
  EXPECT_THROW(run_model_bench(w, c), CollectiveError);
  c = tiny_config();
  c.profile = "no-such-gpu";
  EXPECT_THROW(run_model_bench(w, c), CollectiveError);
  c = tiny_config();
  c.weights.clear();
  EXPECT_THROW(run_model_bench(w, c), CollectiveError);
}

TEST(ModelBench, PlotIsWritten) {
  const Communicator& w = world();
  ModelBenchConfig c = tiny_config();
  c.timing = {0, 1};
  c.modes = {TpMode::kDuplicated, TpMode::kDistributed};
  const ModelBenchReport r = run_model_bench(w, c);
  if (w.rank() != 0) return;
  const auto png = std::filesystem::temp_directory_path() /
                   fmt::format("distmuon-test-model-bench-{}.png", ::getpid());
  render_model_bench_plot(r, png);
  EXPECT_GT(std::filesystem::file_size(png), 1000u);
  std::filesystem::remove(png);
}

}  // namespace
}  // namespace distmuon
