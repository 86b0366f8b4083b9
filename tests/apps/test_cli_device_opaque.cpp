// The CLI on the opaque backend (memory the host cannot address; bit-equal to cpu by design)
// against the same commands on cpu, at 1, 2 and 4 ranks: orthogonalize writes a byte-identical
// file, demo prints the same singular values, bench runs every mode, and train prints and logs the
// same losses, writes byte-identical model and optimizer checkpoint files, and resumes from a cpu
// checkpoint to the same losses; bench --model plans as on cpu and runs its candidates and its
// --plan measure planner there. Exact equality is the claim: the opaque backend runs the CPU
// kernels on its own storage, so any difference means host code touched algorithm data or took
// another path.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "distmuon/npy.h"
#include "test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::read_text;

// The line of `text` that starts with `prefix` ("" when there is none).
std::string line_starting(const std::string& text, const std::string& prefix) {
  std::size_t at = text.rfind("\n" + prefix);
  if (at == std::string::npos)
    return text.rfind(prefix, 0) == 0 ? text.substr(0, text.find('\n')) : "";
  ++at;
  return text.substr(at, text.find('\n', at) - at);
}

class CliDeviceOpaque : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("distmuon_cli_opaque");
    write_npy(dir_ / "in.npy", test::random_matrix(32, 24, 11).view());
    std::ofstream(dir_ / "config.json") << test::tiny_training_config(dir_, 4, 6000);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // np 1 runs one process without mpirun.
  test::CliRun run(const std::string& args) const {
    const int np = GetParam();
    return test::run_cli(np == 1 ? 0 : np, args, dir_ / "run.log");
  }
  // The "step" and loss fields of each line of a JSONL log (the timings differ between runs).
  std::vector<json> losses(const std::string& name) const {
    std::vector<json> out;
    std::ifstream in(dir_ / name);
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      json l = {{"step", j.at("step")}, {"loss", j.at("loss")}};
      if (j.contains("val_loss")) l["val_loss"] = j.at("val_loss");
      out.push_back(l);
    }
    return out;
  }

  fs::path dir_;
};

TEST_P(CliDeviceOpaque, OrthogonalizeWritesTheSameBytes) {
  for (const std::string mode : {"duplicated", "distributed", "blockwise"}) {
    for (const int dim : {0, 1}) {
      const std::string args = fmt::format("--tp-mode {} --partition-dim {}", mode, dim);
      for (const std::string device : {"cpu", "opaque"}) {
        const test::CliRun r = run(fmt::format("orthogonalize {} {} {} --device {}", path("in.npy"),
                                               path(device + ".npy"), args, device));
        ASSERT_EQ(r.exit_code, 0) << args << " " << device << "\n" << r.output;
        EXPECT_NE(r.output.find(" on " + device + " in "), std::string::npos) << r.output;
      }
      const std::string cpu = read_text(dir_ / "cpu.npy");
      EXPECT_FALSE(cpu.empty());
      EXPECT_EQ(read_text(dir_ / "opaque.npy"), cpu) << args;
    }
  }
}

TEST_P(CliDeviceOpaque, DemoRunsAndPrintsTheSameSingularValues) {
  std::string values[2];
  int i = 0;
  for (const std::string device : {"cpu", "opaque"}) {
    const test::CliRun r = run("demo --rows 24 --cols 40 --reps 1 --device " + device);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("  device          " + device + "\n"), std::string::npos) << r.output;
    values[i++] = line_starting(r.output, "  singular values");
  }
  EXPECT_FALSE(values[0].empty());
  EXPECT_EQ(values[1], values[0]);
}

TEST_P(CliDeviceOpaque, BenchRunsEveryMode) {
  const test::CliRun r =
      test::run_cli(GetParam() == 1 ? 0 : GetParam(),
                    "bench --shape 32x16 --reps 1 --warmup 0 --rate-reps 1 --json --device opaque",
                    dir_ / "bench.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  EXPECT_EQ(j.at("device"), "opaque");
  EXPECT_EQ(j.at("results").size(), 3u) << r.output;
}

TEST_P(CliDeviceOpaque, TrainGivesTheSameLossesAndCheckpoints) {
  for (const std::string device : {"cpu", "opaque"}) {
    const test::CliRun r = run(
        fmt::format("train --config {} --device {} --log {} --checkpoint {} --checkpoint-every 2",
                    path("config.json"), device, path(device + ".jsonl"), path(device)));
    ASSERT_EQ(r.exit_code, 0) << device << "\n" << r.output;
    EXPECT_NE(r.output.find("\noptimizer (" + device + "): "), std::string::npos) << r.output;
  }
  const auto cpu = losses("cpu.jsonl");
  ASSERT_EQ(cpu.size(), 4u);
  EXPECT_EQ(losses("opaque.jsonl"), cpu);
  // The model and optimizer files of both checkpoints (trainer.json holds the run's id and the
  // config, which names the device).
  for (const char* step : {"step-00000002", "step-00000004"}) {
    for (const char* part : {"model", "optimizer"}) {
      const auto want = test::files_of(dir_ / "cpu" / step / part);
      EXPECT_FALSE(want.empty()) << step << "/" << part;
      EXPECT_EQ(test::files_of(dir_ / "opaque" / step / part), want) << step << "/" << part;
    }
  }
  // The opaque backend resumes from the cpu run's step 2 (Muon::load into backend memory).
  const test::CliRun r =
      run(fmt::format("train --config {} --device opaque --log {} --resume {}", path("config.json"),
                      path("resumed.jsonl"), (dir_ / "cpu" / "step-00000002").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto resumed = losses("resumed.jsonl");
  EXPECT_EQ(resumed, std::vector<json>(cpu.begin() + 2, cpu.end()));
}

// bench --model on the opaque backend at 2 ranks, a tiny training model (3 shapes, 5 weights):
// with estimate planning it plans exactly what cpu plans (the plan is a pure function of the
// shapes, the group and the options, whichever backend then runs it) and measures every candidate
// and the owner runs; with --plan measure the planner's candidates run on the backend too.
TEST(CliDeviceOpaqueBenchModel, PlansAsCpuAndMeasuresEveryCandidate) {
  const fs::path dir = test::fresh_test_dir("distmuon_cli_opaque_bench_model");
  std::ofstream(dir / "tiny.json")
      << json{{"model", {{"context", 4}, {"embed", 8}, {"hidden", 32}, {"ffn", 64}, {"layers", 2}}}}
             .dump();
  const std::string model = fmt::format(
      "--log-level warn bench --model train-default --config {} --modes duplicated,distributed "
      "--reps 1 --warmup 0 --json",
      (dir / "tiny.json").string());
  // Per shape "m x n: auto's choice", and whether auto planned owner for the whole model.
  auto plan_of = [](const json& j) {
    std::vector<std::string> out = {j.at("auto_owner").dump()};
    for (const json& s : j.at("shapes"))
      out.push_back(fmt::format("{}x{}: {}", s.at("m").get<int>(), s.at("n").get<int>(),
                                s.at("auto").get<std::string>()));
    return out;
  };
  std::vector<std::string> plans[2];
  int i = 0;
  for (const std::string device : {"cpu", "opaque"}) {
    const test::CliRun r =
        test::run_cli(2, model + " --ns-algorithm auto --device " + device, dir / "run.log");
    ASSERT_EQ(r.exit_code, 0) << device << "\n" << r.output;
    json j;
    ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
    EXPECT_EQ(j.at("device"), device);
    ASSERT_EQ(j.at("shapes").size(), 3u) << r.output;
    for (const json& s : j.at("shapes")) {
      for (const char* c : {"duplicated", "distributed", "duplicated+gram", "distributed+gram"})
        EXPECT_GT(s.at("measured").at(c).at("median_ms").get<double>(), 0.0) << device << " " << c;
    }
    ASSERT_GE(j.at("owner").size(), 2u) << r.output;  // all standard, all Gram
    for (const json& o : j.at("owner"))
      EXPECT_GT(o.at("measured").at("median_ms").get<double>(), 0.0) << device;
    plans[i++] = plan_of(j);
  }
  EXPECT_EQ(plans[1], plans[0]);

  const test::CliRun r =
      test::run_cli(2, model + " --plan measure --plan-reps 1 --device opaque", dir / "run.log");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  EXPECT_EQ(j.at("device"), "opaque");
  EXPECT_EQ(j.at("plan"), "measure");
  EXPECT_GT(j.at("plan_timed_runs").get<std::size_t>(), 0u);
  EXPECT_FALSE(j.at("shapes")[0].at("planned_ms").empty());
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CliDeviceOpaque, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return fmt::format("np{}", info.param); });

}  // namespace
}  // namespace distmuon
