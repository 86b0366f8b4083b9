// What `distmuon train` prints and draws: the console report of a real (one-rank) run, the
// decision table, the comparison of two runs and the loss plot.
#include <gtest/gtest.h>

#include <unistd.h>
#include "test_util.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "distmuon/blas_info.h"
#include "distmuon/error.h"
#include "distmuon/train_report.h"
#include "distmuon/trainer.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("distmuon_report_" + std::to_string(::getpid()) + "_" + name);
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1))
    ++n;
  return n;
}

TEST(TrainReport, CompactNamesGroupsLayers) {
  EXPECT_EQ(compact_names({"input"}), "input");
  EXPECT_EQ(compact_names({"blocks.0.fc1", "blocks.1.fc1", "blocks.2.fc1"}), "blocks.*.fc1 (3)");
  EXPECT_EQ(compact_names({"input", "blocks.0.fc2", "blocks.1.fc2"}), "input, blocks.*.fc2 (2)");
  EXPECT_EQ(compact_names({"blocks.3.fc1"}), "blocks.3.fc1");
}

TEST(TrainReport, DecisionTableShowsModeAndBothEstimates) {
  ShapeDecision d;
  d.m = 2048;
  d.n = 256;
  d.names = {"blocks.0.fc1", "blocks.1.fc1"};
  d.mode = TpMode::kDistributed;
  d.sharded = true;
  d.key = AutoKey{.m = 2048, .n = 256, .group_size = 2};
  d.estimate = estimate(d.key, nullptr, CostModel::kRefined);
  const std::string table = format_decisions({d});
  EXPECT_NE(table.find("over 2 ranks"), std::string::npos) << table;
  EXPECT_NE(table.find("2048x256"), std::string::npos) << table;
  EXPECT_NE(table.find("blocks.*.fc1 (2)"), std::string::npos) << table;
  EXPECT_NE(table.find("distributed"), std::string::npos) << table;
  EXPECT_NE(table.find(format_cost(d.estimate.distributed.flops, false)), std::string::npos)
      << table;
  EXPECT_NE(table.find(format_cost(d.estimate.duplicated.flops, false)), std::string::npos)
      << table;
  d.sharded = false;
  d.key.group_size = 1;
  EXPECT_NE(format_decisions({d}).find("unsharded"), std::string::npos);
}

TEST(TrainReport, ComparisonFindsTheLargestDifference) {
  TrainSummary a, b;
  const double losses[] = {3.0, 2.0, 1.5};
  for (int i = 0; i < 3; ++i) {
    a.records.push_back({.step = i + 1, .loss = losses[i], .step_ms = 10, .opt_ms = 4});
    b.records.push_back({.step = i + 1, .loss = losses[i], .step_ms = 20, .opt_ms = 8});
  }
  b.records[1].loss = 2.0 * (1 + 1e-3);
  a.records[2].val_loss = 1.7;
  b.records[2].val_loss = 1.7;
  const std::string text = format_comparison(a, "auto", b, "duplicated");
  EXPECT_NE(text.find("3 steps: auto vs duplicated"), std::string::npos) << text;
  EXPECT_NE(text.find("9.99e-04 (step 2)"), std::string::npos) << text;
  EXPECT_NE(text.find("0.00e+00 over 1 evaluations"), std::string::npos) << text;
  EXPECT_NE(text.find("10.0 ms vs 20.0 ms"), std::string::npos) << text;
}

TEST(TrainReport, ConsoleReportOfARun) {
  const fs::path text = temp_path("text.txt");
  {
    std::string t;
    for (int i = 0; t.size() < 8000; ++i)
      t += (i % 3 == 0) ? "copies of the licence\n" : "free software ";
    std::ofstream(text) << t;
  }
  const TrainConfig config = parse_train_config(json{
      {"model", {{"context", 8}, {"embed", 8}, {"hidden", 16}, {"ffn", 64}, {"layers", 1}}},
      {"data", {{"path", text.string()}}},
      {"train",
       {{"steps", 8}, {"batch", 16}, {"log_every", 4}, {"eval_every", 3}, {"eval_windows", 64}}}});
  const fs::path out_path = temp_path("out.txt");
  std::FILE* out = std::fopen(out_path.c_str(), "w");
  ASSERT_NE(out, nullptr);
  {
    // A progress line on every step not logged, were `out` a terminal: a file gets none.
    ConsoleReport report(out, 1e-9, "run");
    Trainer trainer(config, local_communicator());
    TrainObserver* observers[] = {&report};
    run_training(trainer, {}, observers);
  }
  std::fclose(out);
  std::ifstream in(out_path);
  const std::string got{std::istreambuf_iterator<char>(in), {}};
  EXPECT_NE(got.find("[run] distmuon train: 1 rank (local), seed 1, 8 steps of 16 windows"),
            std::string::npos)
      << got;
  EXPECT_NE(got.find("Muon weights by shape: one rank"), std::string::npos) << got;
  EXPECT_NE(got.find("[run] blas: " + blas_summary() + "\n"), std::string::npos) << got;
  // Logged: 3 and 6 (validation), 4 and 8 (interval; 8 is also the last and validated).
  EXPECT_EQ(count(got, "[run] step "), 4u) << got;
  EXPECT_EQ(count(got, " val "), 3u) << got;
  EXPECT_EQ(count(got, "... step "), 0u) << got;  // quiet in a file (tests/io/test_progress)
  EXPECT_EQ(got.find('\r'), std::string::npos) << got;
  EXPECT_NE(got.find("tok/s"), std::string::npos);
  EXPECT_NE(got.find("(NS "), std::string::npos);
  EXPECT_NE(got.find("final validation loss"), std::string::npos) << got;
  EXPECT_NE(got.find("unigram entropy"), std::string::npos) << got;
  fs::remove(out_path);
  fs::remove(text);
}

TEST(TrainReport, LossPlot) {
  EXPECT_THROW(check_plot_possible(temp_path("missing-folder") / "x.png"), Error);
  TrainSummary s;
  for (int i = 1; i <= 10; ++i) {
    s.records.push_back({.step = i, .loss = 5.0 / i});
    if (i % 5 == 0) s.records.back().val_loss = 5.5 / i;
  }
  const LossCurve c = loss_curve(s, "auto");
  EXPECT_EQ(c.train.size(), 10u);
  ASSERT_EQ(c.val.size(), 2u);
  EXPECT_EQ(c.val[1], (std::pair<int, double>{10, 0.55}));
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) GTEST_SKIP() << "no gnuplot";
  const fs::path png = temp_path("loss.png");
  render_loss_plot({c, loss_curve(s, "duplicated")}, 3.17, "test's 'title'", png);
  EXPECT_TRUE(test::is_png_file(png));
  fs::remove(png);
}

}  // namespace
}  // namespace distmuon
