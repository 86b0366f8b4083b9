// What the user reads (docs/reliability.md): sizes checked before the work, option values
// refused with their range instead of being ignored or read as something else, a folder given
// for a file, duplicate or misspelled JSON keys, and messages without the internals of the
// libraries underneath (nlohmann::json, libstdc++, CLI11). Each run is short: a refusal comes
// before any work.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class CliMessages : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::fresh_test_dir("distmuon_cli_messages"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name) << text;
  }

  // `distmuon ARGS` on np ranks (0: one process) must fail within seconds naming needle, with
  // none of the internals' words in what it prints.
  test::CliRun expect_refused(const std::string& args, const std::string& needle, int np = 2,
                              const std::string& env = "") {
    const auto t0 = std::chrono::steady_clock::now();
    const test::CliRun r = test::run_cli(np, args, dir_ / "log.txt", env);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_LT(s, 30.0) << args << ": refused only after " << s << " s";
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
    for (const char* internal :
         {"[json.exception", "basic_filebuf", "std::bad_alloc", "MPI_ERR", "MPI_ABORT",
          "what():", "This should be caught", "Could not convert", "required INT", "required UINT",
          "required TEXT", "required FLOAT", "required NUMBER", "MuonOptions", "std::"})
      EXPECT_EQ(r.output.find(internal), std::string::npos) << args << "\n" << r.output;
    return r;
  }
  test::CliRun expect_ok(const std::string& args, int np = 0) {
    const test::CliRun r = test::run_cli(np, args, dir_ / "log.txt");
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    return r;
  }

  fs::path dir_;
};

// ---- section 3: memory and time checked before the work ---------------------------------------

TEST_F(CliMessages, HugeBatchIsRefusedWithTheMemoryFigure) {
  json config = test::tiny_training_config(dir_, 2);
  config["train"]["batch"] = 200000000;
  write("huge.json", config.dump());
  expect_refused("train --config " + path("huge.json"), "needs about");
  config["train"]["batch"] = 8;
  config["train"]["eval_windows"] = 400000000;  // the validation windows count too
  write("huge_eval.json", config.dump());
  expect_refused("train --config " + path("huge_eval.json"), "needs about");
}

TEST_F(CliMessages, CalibrateAndPlanSizesAreBounded) {
  expect_refused("calibrate --out " + path("p.json") + " --sizes 64,100000",
                 "100000 is not an integer from 1 to 16384", 0);
  expect_refused("calibrate --out " + path("p.json") + " --max-bytes 18446744073709551615",
                 "is not an integer from 1 to 1073741824", 0);
  expect_refused("plan --shape 64x64 --steps 100000", "100000 is not an integer from 1 to 100", 0);
  expect_refused("plan --shape 64x64 --elem-size 3", "--elem-size", 0);
  EXPECT_FALSE(fs::exists(dir_ / "p.json"));
  // The ranges are shown in --help.
  const auto help = expect_ok("calibrate --help").output;
  EXPECT_NE(help.find("INT in [1 - 16384]"), std::string::npos) << help;
  EXPECT_NE(help.find("INT in [1 - 1073741824]"), std::string::npos) << help;
  EXPECT_NE(expect_ok("plan --help").output.find("INT in [1 - 100]"), std::string::npos);
  EXPECT_NE(expect_ok("train --help").output.find("NUMBER in [0 - 3600]"), std::string::npos);
}

// ---- section 4: refused instead of silently ignored -------------------------------------------

// CLI11's own texts that name C++ types or its internals, rewritten: a missing value, a value
// that does not convert (past the option's integer type), on one process and on one rank of two.
TEST_F(CliMessages, ParseErrorsNameNoTypes) {
  expect_refused("train --steps", "--steps: its value is missing", 0);
  expect_refused("--log-level", "--log-level: its value is missing", 0);
  expect_refused("orthogonalize --steps 99999999999999",
                 "--steps: 99999999999999 is not a value of this option", 0);
  expect_refused("train --step-timeout", "--step-timeout: its value is missing", 2);
  expect_refused("train --steps 3 --steps 4", "--steps: given 2 times, at most 1", 0);
  expect_refused("nonsense", "no command given (or an unknown one): one of demo,", 0);
}

TEST_F(CliMessages, LogLevelIsCheckedAndAcceptedAfterTheSubcommand) {
  expect_refused("--log-level bogus plan --shape 8x8", "bogus", 0);
  expect_refused("plan --shape 8x8 --log-level bogus", "bogus", 0);
  expect_ok("plan --shape 8x8 --log-level warn");
  // warn silences info, after the subcommand too: plan's info line about the profile is gone.
  const auto quiet = expect_ok("plan --shape 8x8 -G 16 --profile h100 --log-level error").output;
  EXPECT_EQ(quiet.find("[warning]"), std::string::npos) << quiet;
  const auto loud = expect_ok("plan --shape 8x8 -G 16 --profile h100").output;
  EXPECT_NE(loud.find("[warning]"), std::string::npos) << loud;
}

TEST_F(CliMessages, ProgressAndEmptyPathsAreRefused) {
  expect_refused("train --progress -1", "-1 is not a number from 0 to 3600", 0);
  expect_refused("train --progress nan", "nan is not a number from 0 to 3600", 0);
  expect_refused("train --progress inf", "inf is not a number from 0 to 3600", 0);
  for (const char* opt : {"--checkpoint", "--log", "--resume", "--config", "--data"})
    expect_refused(fmt::format("train {} ''", opt), "an empty name is no file or folder", 0);
  expect_refused("calibrate --out ''", "an empty name is no file or folder", 0);
}

TEST_F(CliMessages, BenchModelOptionsWithoutModelAreRefused) {
  for (const std::string opt :
       {"--plot x.png", "--config c.json", "--profile h100", "--cost-model reference",
        "--plan measure", "--wisdom w.json", "--max-elements 10", "--plan-reps 2"}) {
    expect_refused("bench " + opt, "requires --model", 0);
  }
}

TEST_F(CliMessages, CostModelHasOneNameAndTheOldOneWarns) {
  const auto plain = expect_ok("plan --shape 8x8 --cost-model reference").output;
  EXPECT_EQ(plain.find("deprecated"), std::string::npos) << plain;
  const auto old = expect_ok("plan --shape 8x8 --model-cost reference").output;
  EXPECT_NE(old.find("--model-cost is deprecated: use --cost-model"), std::string::npos) << old;
  EXPECT_EQ(old.find("refined model"), std::string::npos) << old;  // the value is used
  expect_refused("plan --shape 8x8 --cost-model reference --model-cost refined", "excludes", 0);
}

TEST_F(CliMessages, ExistingLogIsNotTruncatedByANewRun) {
  write("config.json", test::tiny_training_config(dir_, 2).dump());
  write("run.jsonl", "{\"step\": 1}\n");
  expect_refused(fmt::format("train --config {} --log {}", path("config.json"), path("run.jsonl")),
                 "the file exists (12 bytes) and a new run would overwrite it");
  std::ifstream in(dir_ / "run.jsonl");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "{\"step\": 1}");
}

// ---- section 4: no internals in messages -------------------------------------------------------

TEST_F(CliMessages, AFolderGivenForAFileIsNamed) {
  fs::create_directories(dir_ / "folder");
  const std::string folder = path("folder");
  expect_refused("train --data " + folder, "text data '" + folder + "' is a directory, not a file");
  expect_refused("train --config " + folder,
                 "train config '" + folder + "' is a directory, not a file");
  // Profiles and presets are looked up by name or path: a folder is neither.
  expect_refused("plan --shape 8x8 --profile " + folder, "does not exist as a regular file", 0);
  expect_refused("plan --model " + folder, "not a file and not a built-in preset", 0);
  expect_refused("topology", "is a directory, not a file", 2, "DISTMUON_TOPOLOGY_FILE=" + folder);
}

TEST_F(CliMessages, JsonSyntaxDuplicatesAndMisspelledFieldsAreNamed) {
  write("dup.json", R"({"train": {"steps": 2, "steps": 3}})");
  expect_refused("train --config " + path("dup.json"), "key 'steps' appears twice in one object");
  write("syntax.json", R"({"train": {"steps": 2,}})");
  expect_refused("train --config " + path("syntax.json"), "not valid JSON: parse error at line 1");
  // A profile with an optional field misspelled (intra_domain_peer_gbps): refused, not ignored.
  std::ifstream in(fs::path(DISTMUON_PROFILES_DIR) / "h100.json");
  json profile = json::parse(in);
  profile["intra_domain_peer_gpbs"] = profile["intra_domain_peer_gbps"];
  profile.erase("intra_domain_peer_gbps");
  write("typo.json", profile.dump());
  expect_refused("plan --shape 8x8 --profile " + path("typo.json"),
                 "unknown field 'intra_domain_peer_gpbs'", 0);
}

TEST_F(CliMessages, ABadOutputPathIsNotAnInputError) {
  fs::create_directories(dir_ / "folder");
  write("in.npy", "not an npy");
  const auto r = expect_refused(fmt::format("orthogonalize {} {}", path("in.npy"), path("folder")),
                                "checking the output path");
  EXPECT_EQ(r.output.find("reading the input"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace distmuon
