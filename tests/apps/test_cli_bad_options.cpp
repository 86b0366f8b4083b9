// Bad settings given to the CLI under `mpirun -np 2` (docs/reliability.md, bad inputs): custom
// Newton-Schulz coefficients that are not finite, absurd or divergent; a --profile that names a
// missing file or no exact built-in name; profile values out of range; and a new run writing
// into another run's checkpoint folder. Each must fail on every rank with a message naming what
// is wrong, a non-zero exit, and no output (no file written, a checkpoint folder unchanged).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "distmuon/npy.h"
#include "test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::files_of;
using test::read_text;

class CliBadOptions : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("distmuon_bad_options");
    write_npy(dir_ / "in.npy", test::random_matrix(16, 8, 3).view());
    config_ = test::tiny_training_config(dir_, 4);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  test::CliRun run(const std::string& args, int np = 2) const {
    return test::run_cli(np, args, dir_ / "log.txt");
  }

  // Runs `distmuon ARGS` on 2 ranks; expects a non-zero exit naming `needle`, the ranks ended by
  // agreement (no MPI_ABORT), and no file `out` left behind.
  void expect_refused(const std::string& args, const std::string& needle,
                      const std::string& out = {}) const {
    const test::CliRun r = run(args);
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << "aborted: " << r.output;
    if (!out.empty()) EXPECT_FALSE(fs::exists(out)) << "partial output: " << out;
  }

  // `train` with config_ (written to config.json) and ARGS.
  std::string train(const std::string& args) const {
    std::ofstream(dir_ / "config.json") << config_.dump();
    return "train --config " + path("config.json") + " " + args;
  }

  fs::path dir_;
  json config_;
};

// ---- Newton-Schulz coefficients ---------------------------------------------------------------

// NaN, an infinity or 1e30 made an all-NaN (or Inf) output with exit 0.
TEST_F(CliBadOptions, NonFiniteOrAbsurdCoefficients) {
  for (const auto& [coefficients, needle] :
       std::map<std::string, std::string>{{"nan,1,1", "a = nan"},
                                          {"3,-4,2;inf,1,1", "tuple 2 (inf, 1, 1)"},
                                          {"1e30,1,1", "a = 1e+30"}}) {
    expect_refused(fmt::format("orthogonalize {} {} --tp-mode distributed --coefficients custom "
                               "--custom-coefficients '{}'",
                               path("in.npy"), path("out.npy"), coefficients),
                   needle, path("out.npy"));
  }
  // Training: refused before the first step, so no checkpoint exists.
  config_["optimizer"] = {{"coefficients", "custom"}, {"custom_coefficients", "1,nan,1"}};
  expect_refused(train("--checkpoint " + path("ckpt")), "b = nan");
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "step-00000004"));
}

// Coefficients within the bound that diverge (values grow by up to 300x per step), and built-in
// sets at step counts where they shrink the update (aol at 5, quintic at 6): refused when
// the options are read, before any work, by orthogonalize, demo and train, naming the set, the
// step count and the step counts it supports. Nothing is written, nothing printed or trained.
TEST_F(CliBadOptions, DivergentCoefficients) {
  expect_refused(fmt::format("orthogonalize {} {} --coefficients custom --custom-coefficients "
                             "'100,100,100'",
                             path("in.npy"), path("out.npy")),
                 "'custom' at 5 steps does not orthogonalise", path("out.npy"));
  expect_refused(fmt::format("orthogonalize {} {} --tp-mode distributed --coefficients aol",
                             path("in.npy"), path("out.npy")),
                 "'aol' at 5 steps does not orthogonalise", path("out.npy"));
  for (const std::string args : {"--coefficients custom --custom-coefficients '100,100,100'",
                                 "--coefficients quintic --steps 6"}) {
    const test::CliRun r = run("demo --rows 64 --cols 128 --reps 1 " + args, 1);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("does not orthogonalise"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("polar alignment"), std::string::npos) << r.output;  // no report
  }
  const test::CliRun q6 = run("demo --rows 64 --cols 128 --reps 1 --steps 6", 1);
  EXPECT_NE(q6.output.find("supports 4-5, 9-10, 14-15, 19-20 steps"), std::string::npos)
      << q6.output;
  // Training: refused before the first step (it failed at the next forward pass), on every rank.
  config_["optimizer"] = {{"coefficients", "custom"}, {"custom_coefficients", "100,100,100"}};
  expect_refused(train("--checkpoint " + path("ckpt")), "'custom' at 5 steps");
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "step-00000004"));
}

// demo reports the signed alignment with the true polar factor, so that a reversal is visible
// (the singular values of a reversed result are the same as those of a good one).
TEST_F(CliBadOptions, DemoReportsPolarAlignment) {
  const test::CliRun r = run("demo --rows 64 --cols 128 --reps 1", 1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto at = r.output.find("polar alignment ");
  ASSERT_NE(at, std::string::npos) << r.output;
  // quintic at 5 steps: singular values in [0.978, 1.032] (docs/optimizer.md), so the cosine
  // with U V^T is above 0.999.
  EXPECT_GT(std::stod(r.output.substr(at + 16)), 0.999) << r.output;
}

// ---- --profile: a file or an exact name -------------------------------------------------------

// A missing file whose name contains a built-in name fell back to that profile ("h100"); a near
// name ("h1000") took the profile it contains.
TEST_F(CliBadOptions, ProfileSpecIsAFileOrAnExactName) {
  const std::string plan = "plan --model llama3-8b --group-size 2 --profile ";
  expect_refused(plan + path("h100-tuned.json"), "h100-tuned.json' does not exist");
  expect_refused(plan + "h1000", "unknown hardware profile 'h1000' (did you mean 'h100'?)");
  expect_refused(plan + "gb2", "ambiguous hardware profile name 'gb2'");
  expect_refused(train("--tp-mode auto --profile " + path("h100-tuned.json")), "does not exist");
  const test::CliRun ok = run(plan + "H100");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("profile h100"), std::string::npos) << ok.output;
}

// ---- hardware profile values ------------------------------------------------------------------

TEST_F(CliBadOptions, ProfileValuesOutOfRange) {
  const json h100 = json::parse(read_text(fs::path(DISTMUON_PROFILES_DIR) / "h100.json"));
  const auto refused = [&](const json& j, const std::string& needle) {
    std::ofstream(dir_ / "profile.json") << j.dump();
    expect_refused("plan --model llama3-8b --group-size 2 --profile " + path("profile.json"),
                   needle);
  };
  json j = h100;
  j["domain_size"] = 4294967304LL;  // 2^32 + 8: read as 8 before
  refused(j, "'domain_size' must be an integer in");
  j["domain_size"] = 2147483648LL;  // 2^31: a negative domain size before
  refused(j, "got 2147483648");
  j["domain_size"] = 1.5;  // truncated to 1 before
  refused(j, "got 1.5");
  j = h100;
  j["intra_domain_gbps"] = 1e-300;
  refused(j, "'intra_domain_gbps' is 1e-300, outside the plausible range");
  j = h100;
  j["inter_domain_latency_us"] = 1e20;
  refused(j, "'inter_domain_latency_us' is 1e+20, outside the plausible range");
}

// ---- checkpoint folders of another run ----------------------------------------------------------

// Run A checkpoints steps 2 and 4. A new run B (another seed) into the same folder overwrote
// step 2, and --resume then picked A's step 4. Now: refused without a word changed; with
// --overwrite-checkpoints B replaces them; resuming A into its own folder keeps working.
TEST_F(CliBadOptions, NewRunIntoAnotherRunsCheckpointFolder) {
  const std::string ckpt = path("ckpt");
  // The checkpoints, without the folder's lock file (it names the last run that held it).
  const auto checkpoints = [&] {
    auto files = files_of(ckpt);
    files.erase(".lock");
    return files;
  };
  test::CliRun r = run(train("--checkpoint-every 2 --checkpoint " + ckpt));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto saved = checkpoints();
  ASSERT_TRUE(saved.contains("step-00000004/trainer.json"));

  expect_refused(train("--seed 2 --steps 2 --checkpoint " + ckpt),
                 "holds checkpoints of another run: step-00000004");
  EXPECT_TRUE(checkpoints() == saved) << "the other run's checkpoints changed";

  r = run(train("--steps 6 --checkpoint-every 2 --checkpoint " + ckpt + " --resume " + ckpt));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed at step 4"), std::string::npos) << r.output;

  r = run(train("--seed 2 --steps 2 --overwrite-checkpoints --checkpoint " + ckpt));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("holds checkpoints of another run"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "step-00000006"));
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "step-00000004"));
  r = run(train("--seed 2 --steps 3 --resume " + ckpt));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed at step 2"), std::string::npos) << r.output;

  expect_refused(train("--overwrite-checkpoints"), "--checkpoint");
}

}  // namespace
}  // namespace distmuon
