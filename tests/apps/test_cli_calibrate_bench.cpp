// `distmuon calibrate` and `distmuon bench --model` end to end: a tiny calibration at one and two
// ranks writes a profile that loads and that bench --profile accepts; bench --model train-default
// on a tiny training config prints JSON with every field and totals that add up, and draws the
// plot; the refusals.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "distmuon/hardware_profile.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kTinyCalibration =
    "calibrate --sizes 16,32 --min-bytes 8 --max-bytes 4096 --factor 8 --reps 1 --comm-reps 2";

TEST(CliCalibrate, WritesAProfileThatLoadsAtOneAndTwoRanks) {
  const auto dir = test::fresh_test_dir("distmuon_calibrate");
  for (int np : {0, 2}) {
    SCOPED_TRACE(fmt::format("np {}", np));
    const fs::path out = dir / fmt::format("cal{}.json", np);
    const test::CliRun r = test::run_cli(
        np, fmt::format("{} --name tiny{} --out {}", kTinyCalibration, np, out.string()),
        dir / "log.txt");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("update_gemm"), std::string::npos) << r.output;
    const HardwareProfile p = load_profile(out);
    EXPECT_EQ(p.name, fmt::format("tiny{}", np));
    ASSERT_TRUE(p.calibration.has_value());
    EXPECT_EQ(p.calibration->group_size, np == 0 ? 1 : np);
    EXPECT_EQ(p.calibration->all_reduce.has_value(), np > 1);
    // The profile spec accepts the file as it accepts a built-in name.
    EXPECT_EQ(resolve_profile(out.string()), p);
  }
  // An output folder that does not exist fails on every rank, before measuring.
  const test::CliRun bad = test::run_cli(
      2, fmt::format("{} --out {}", kTinyCalibration, (dir / "missing" / "x.json").string()),
      dir / "log.txt");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("does not exist"), std::string::npos) << bad.output;
  EXPECT_EQ(bad.output.find("MPI_ABORT"), std::string::npos) << bad.output;
  fs::remove_all(dir);
}

TEST(CliBenchModel, TrainDefaultOnATinyConfigGivesJsonTotalsAndAPlot) {
  const auto dir = test::fresh_test_dir("distmuon_bench_model");
  const fs::path config = dir / "tiny.json";
  std::ofstream(config)
      << json{{"model", {{"context", 4}, {"embed", 8}, {"hidden", 32}, {"ffn", 64}, {"layers", 2}}}}
             .dump();
  const fs::path profile = dir / "cal.json";
  ASSERT_EQ(test::run_cli(2, fmt::format("{} --out {}", kTinyCalibration, profile.string()),
                          dir / "log.txt")
                .exit_code,
            0);
  const fs::path png = dir / "bench.png";
  const test::CliRun r = test::run_cli(
      2,
      fmt::format("--log-level warn bench --model train-default --config {} --profile {} --reps 1 "
                  "--warmup 0 --ns-algorithm auto --json --plot {}",
                  config.string(), profile.string(), png.string()),
      dir / "log.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << "not exactly one JSON object:\n" << r.output;
  EXPECT_EQ(j.at("group_size"), 2);
  EXPECT_EQ(j.at("profile"), "calibrated");
  EXPECT_EQ(j.at("cost_model"), "refined");
  for (const char* key : {"blas_threads", "crosses_domain", "steps", "syrk", "reps", "modes"})
    EXPECT_TRUE(j.contains(key)) << key;
  // input [32, 4 x 8], fc1 [64, 32] x 2, fc2 [32, 64] x 2.
  ASSERT_EQ(j.at("shapes").size(), 3u);
  const std::vector<std::tuple<int, int, int>> expected = {{32, 32, 1}, {64, 32, 2}, {32, 64, 2}};
  const bool auto_owner = j.at("auto_owner");
  double dup = 0, dist = 0, chosen = 0, oracle = 0;
  std::vector<std::string> planned;  // auto's algorithm per weight
  for (std::size_t i = 0; i < 3; ++i) {
    const json& s = j["shapes"][i];
    SCOPED_TRACE(s.dump());
    EXPECT_EQ(s.at("m"), std::get<0>(expected[i]));
    EXPECT_EQ(s.at("n"), std::get<1>(expected[i]));
    EXPECT_EQ(s.at("count"), std::get<2>(expected[i]));
    for (const char* mode : {"duplicated", "distributed", "blockwise", "duplicated+gram",
                             "distributed+gram", "blockwise+gram"})
      EXPECT_GT(s.at("measured").at(mode).at("median_ms").get<double>(), 0.0) << mode;
    for (const char* mode : {"duplicated", "distributed", "duplicated+gram", "distributed+gram",
                             "owner", "owner+gram"})
      EXPECT_GT(s.at("model").at(mode).at("predicted_ms").get<double>(), 0.0) << mode;
    const double d = s["measured"]["duplicated"]["median_ms"];
    const double t = s["measured"]["distributed"]["median_ms"];
    const double best = std::min({d, t, s["measured"]["duplicated+gram"]["median_ms"].get<double>(),
                                  s["measured"]["distributed+gram"]["median_ms"].get<double>()});
    const std::string choice = s.at("auto");
    EXPECT_EQ(auto_owner, choice.starts_with("owner")) << choice;
    const double c = s["count"];
    planned.insert(planned.end(), static_cast<std::size_t>(c),
                   choice.ends_with("+gram") ? "gram" : "standard");
    if (!auto_owner) {
      const double a = s["measured"][choice]["median_ms"];
      EXPECT_EQ(s.at("auto_ms").get<double>(), a);
      chosen += c * a;
    }
    EXPECT_EQ(s.at("fastest_ms").get<double>(), best);
    EXPECT_GE(s.at("regret").get<double>(), 0.0);
    dup += c * d;
    dist += c * t;
    oracle += c * best;
  }
  const json& totals = j.at("totals");
  // Relative 1e-9: the JSON's doubles are summed in the same order (ms instead of s).
  EXPECT_NEAR(totals.at("duplicated_ms").get<double>(), dup, 1e-9 * dup);
  EXPECT_NEAR(totals.at("distributed_ms").get<double>(), dist, 1e-9 * dist);
  EXPECT_NEAR(totals.at("per_weight_oracle_ms").get<double>(), oracle, 1e-9 * oracle);
  // Owner over the 5 weights: all standard, all Gram (and auto's mix when it differs).
  ASSERT_GE(j.at("owner").size(), 2u);
  for (const json& o : j.at("owner")) {
    EXPECT_EQ(o.at("algorithms").size(), 5u);
    const double ms = o.at("measured").at("median_ms");
    oracle = std::min(oracle, ms);
    // Auto's time is its pipelined owner run's, not the serial schedule's run of the same
    // algorithms.
    if (auto_owner && !o.at("serial").get<bool>() &&
        o.at("algorithms").get<std::vector<std::string>>() == planned)
      chosen = ms;
  }
  EXPECT_NEAR(totals.at("auto_ms").get<double>(), chosen, 1e-9 * chosen);
  EXPECT_NEAR(totals.at("oracle_ms").get<double>(), oracle, 1e-9 * oracle);
  EXPECT_LE(totals.at("oracle_ms").get<double>(), totals.at("duplicated_ms").get<double>());
  EXPECT_LE(totals.at("oracle_ms").get<double>(), totals.at("distributed_ms").get<double>());
  EXPECT_GE(totals.at("auto_ms").get<double>(), totals.at("oracle_ms").get<double>());
  EXPECT_TRUE(totals.at("predicted").contains("auto_ms"));
  ASSERT_TRUE(fs::exists(png));
  EXPECT_GT(fs::file_size(png), 1000u);
  fs::remove_all(dir);
}

// --plan measure: the first run times the planner's candidates and writes the wisdom file, the
// second reads every time from it and times nothing; a damaged file stops both ranks cleanly.
TEST(CliBenchModel, PlanMeasureWritesWisdomThenReusesIt) {
  const auto dir = test::fresh_test_dir("distmuon_bench_measure");
  const fs::path config = dir / "tiny.json";
  std::ofstream(config)
      << json{{"model", {{"context", 4}, {"embed", 8}, {"hidden", 32}, {"ffn", 64}, {"layers", 2}}}}
             .dump();
  const fs::path wisdom = dir / "wisdom.json";
  const std::string args = fmt::format(
      "--log-level warn bench --model train-default --config {} --modes duplicated,distributed "
      "--reps 1 --warmup 0 --plan measure --plan-reps 1 --wisdom {} --json",
      config.string(), wisdom.string());
  std::vector<std::size_t> timed;
  for (int run = 0; run < 2; ++run) {
    const test::CliRun r = test::run_cli(2, args, dir / "log.txt");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    json j;
    ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
    EXPECT_EQ(j.at("plan"), "measure");
    EXPECT_FALSE(j.at("shapes")[0].at("planned_ms").empty());
    EXPECT_GT(j.at("totals").at("predicted").at("auto_ms").get<double>(), 0.0);
    timed.push_back(j.at("plan_timed_runs").get<std::size_t>());
    ASSERT_TRUE(fs::exists(wisdom));
  }
  EXPECT_GT(timed[0], 0u);
  EXPECT_EQ(timed[1], 0u);

  std::ofstream(wisdom) << "{\"format\": ";
  const test::CliRun bad = test::run_cli(2, args, dir / "log.txt");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("not valid JSON"), std::string::npos) << bad.output;
  EXPECT_EQ(bad.output.find("MPI_ABORT"), std::string::npos) << bad.output;
  fs::remove_all(dir);
}

TEST(CliBenchModel, RefusalsFailOnEveryRankWithoutAbort) {
  const auto dir = test::fresh_test_dir("distmuon_bench_model");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--model llama3-70b", "--max-elements"},
      {"--model llama3-8b --config x.json", "train-default only"},
      {"--model train-default --shape 64x64", "--shape"},
      {"--model no-such-model", "unknown model"},
      {"--model train-default --profile no-such-gpu", "unknown hardware profile"},
      {"--shape 64x64 --ns-algorithm auto", "--ns-algorithm auto applies to"},
      {"--model train-default --wisdom w.json", "--wisdom applies to --plan measure"},
      // Checked before anything is timed, as --plot is (the wisdom is written after the timing).
      {"--model train-default --plan measure --wisdom " + dir.string(), "is a directory"}};
  for (const auto& [args, message] : cases) {
    const test::CliRun r = test::run_cli(2, "bench --reps 1 " + args, dir / "log.txt");
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << args << "\n" << r.output;
  }
  // plan knows the training model too.
  const test::CliRun plan = test::run_cli(0, "plan --model train-default -G 2", dir / "log.txt");
  EXPECT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_NE(plan.output.find("fc1"), std::string::npos) << plan.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace distmuon
