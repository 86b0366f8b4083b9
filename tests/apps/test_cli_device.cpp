// `--device` of demo, orthogonalize, bench (--shape and --model) and train under `mpirun -np 2`: a
// device that is no backend of this build (tpu) is refused naming the valid ones, cuda without a
// GPU (or without a CUDA build) fails with its reason; either way once, with a non-zero exit on
// every rank and no hang, and no output file. The commands say which device ran.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/npy.h"
#include "test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class CliDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("distmuon_cli_device");
    write_npy(dir_ / "in.npy", test::random_matrix(16, 8, 3).view());
    config_ = test::tiny_training_config(dir_, 2);
    std::ofstream(dir_ / "config.json") << config_.dump();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Each command with `--device DEVICE` and a small problem; the output file it would write.
  struct Command {
    std::string args, out;
  };
  std::vector<Command> commands(const std::string& device) const {
    const std::string d = " --device " + device;
    return {{"demo --rows 16 --cols 8 --reps 1" + d, ""},
            {"orthogonalize " + path("in.npy") + " " + path("out.npy") + d, path("out.npy")},
            {"bench --shape 16x8 --reps 1 --warmup 0 --rate-reps 1 --json" + d, ""},
            {"train --config " + path("config.json") + " --log " + path("log.jsonl") + d,
             path("log.jsonl")},
            {"--log-level warn bench --model train-default --config " + path("config.json") +
                 " --modes duplicated,distributed --reps 1 --warmup 0 --json" + d,
             ""}};
  }

  // Runs args on 2 ranks: a non-zero exit, `reason` said exactly once (by rank 0, for every
  // rank), no MPI_ABORT (every rank ended by itself) and no output file.
  void expect_refused(const Command& c, const std::string& reason) const {
    const test::CliRun r = test::run_cli(2, c.args, dir_ / "run.log");
    EXPECT_NE(r.exit_code, 0) << c.args << "\n" << r.output;
    const auto at = r.output.find(reason);
    ASSERT_NE(at, std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find(reason, at + 1), std::string::npos) << "said twice:\n" << r.output;
    EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << "aborted: " << r.output;
    if (!c.out.empty()) EXPECT_FALSE(fs::exists(c.out)) << c.args;
  }

  fs::path dir_;
  json config_;
};

TEST_F(CliDevice, UnknownDeviceIsRefusedNamingTheValidOnes) {
  const std::string valid = fmt::format("{}", fmt::join(compute_backend_names(), ", "));
  for (const Command& c : commands("tpu"))
    expect_refused(c, fmt::format("unknown device 'tpu' (valid: {})", valid));
}

TEST_F(CliDevice, CudaWithoutAGpuFailsOnEveryRank) {
  std::string reason;
  try {
    compute_backend("cuda");
  } catch (const Error& e) {
    reason = e.what();
  }
  if (reason.empty()) GTEST_SKIP() << "this machine runs the CUDA backend";
  for (const Command& c : commands("cuda"))
    expect_refused(c, reason);
}

TEST_F(CliDevice, TrainConfigDeviceIsResolvedToo) {
  config_["train"]["device"] = "tpu";
  std::ofstream(dir_ / "config.json") << config_.dump();
  expect_refused({"train --config " + path("config.json"), ""}, "unknown device 'tpu'");
}

TEST_F(CliDevice, OutputsNameTheDevice) {
  const auto c = commands("cpu");
  test::CliRun r = test::run_cli(2, c[0].args, dir_ / "run.log");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  device          cpu\n"), std::string::npos) << r.output;
  r = test::run_cli(2, c[1].args, dir_ / "run.log");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("duplicated over 2 ranks (dim 0) on cpu in "), std::string::npos)
      << r.output;
  r = test::run_cli(2, c[2].args, dir_ / "bench.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(r.output).at("device"), "cpu") << r.output;
  r = test::run_cli(2, c[3].args, dir_ / "run.log");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\noptimizer (cpu): Muon lr"), std::string::npos) << r.output;
  r = test::run_cli(2, c[4].args, dir_ / "bench.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(r.output).at("device"), "cpu") << r.output;
}

}  // namespace
}  // namespace distmuon
