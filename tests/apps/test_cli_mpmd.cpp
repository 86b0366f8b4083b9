// Ranks launched with different command lines (an MPMD launch `mpirun -np 1 distmuon A : -np 1
// distmuon B`, a launch script that differs per rank) or different input files: every rank ends
// with one error naming the option or file that differs, before the first collective. Before
// the command-line agreement these ended in heap corruption, hangs, MPI_ERR_TRUNCATE or a mixed
// result written with exit status 0 (docs/reliability.md).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli_runner.h"
#include "distmuon/npy.h"
#include "test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using test::CliRun;
using test::run_cli;

class CliMpmd : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("distmuon_cli_mpmd");
    std::ofstream(dir_ / "tiny.json") << test::tiny_training_config(dir_, 4).dump();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // mpirun -np 1 distmuon A : -np 1 distmuon B (rank 0 runs A, rank 1 runs B); with folders,
  // rank 0 runs in dir_/a and rank 1 in dir_/b.
  CliRun mpmd(const std::string& a, const std::string& b, bool folders = false) {
    const fs::path here = fs::current_path();
    if (folders) fs::current_path(dir_ / "a");
    const std::string wdir = folders ? "-wdir " + (dir_ / "b").string() + " " : "";
    const CliRun r =
        run_cli(1, a + " : " + wdir + "-np 1 " + DISTMUON_CLI + " " + b, dir_ / "out.txt");
    fs::current_path(here);
    return r;
  }

  // Both ranks end (no hang: run_cli's limit), non-zero, with one error naming `names`, and
  // without the crashes and internals seen before.
  void expect_named(const CliRun& r, const std::string& names) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << r.output;
    EXPECT_NE(r.output.find("distmuon: error: the command line"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(names), std::string::npos) << r.output;
    for (const char* bad : {"free()", "Segmentation", "MPI_ERR", "std::", "double free"})
      EXPECT_EQ(r.output.find(bad), std::string::npos) << bad << "\n" << r.output;
  }

  std::string train(const std::string& args) const {
    return "train --config " + (dir_ / "tiny.json").string() + " " + args;
  }

  fs::path dir_;
};

TEST_F(CliMpmd, TrainingStepsDiffer) {
  // Before: free(): invalid pointer / SIGSEGV.
  expect_named(mpmd(train("--steps 2"), train("--steps 3")),
               "train --steps=3 where rank 0 has train --steps=2");
}

TEST_F(CliMpmd, CheckpointOnOneRankOnly) {
  // Before: a hang (rank 0 saving, rank 1 stepping).
  const std::string ckpt = (dir_ / "ckpt").string();
  expect_named(mpmd(train("--checkpoint " + ckpt), train("")), "train --checkpoint");
  EXPECT_FALSE(fs::exists(dir_ / "ckpt"));
}

TEST_F(CliMpmd, CheckpointIntervalsDiffer) {
  // Before: MPI_ERR_TRUNCATE.
  const std::string ckpt = " --checkpoint " + (dir_ / "ckpt").string();
  expect_named(mpmd(train("--checkpoint-every 2" + ckpt), train("--checkpoint-every 3" + ckpt)),
               "train --checkpoint-every=3 where rank 0 has train --checkpoint-every=2");
}

TEST_F(CliMpmd, BenchShapesDiffer) {
  expect_named(mpmd("bench --shape 64x64 --reps 1", "bench --shape 128x128 --reps 1"),
               "bench --shape=128x128 where rank 0 has bench --shape=64x64");
}

TEST_F(CliMpmd, OrthogonalizeOptionsDifferAndNothingIsWritten) {
  const fs::path in = dir_ / "g.npy", out = dir_ / "o.npy";
  const Matrix g = test::random_matrix(32, 16, 3);
  write_npy(in, g.view());
  const std::string io = " " + in.string() + " " + out.string();
  // Before: a hang (distributed : duplicated) and a half 3-step result with exit 0.
  expect_named(
      mpmd("orthogonalize --tp-mode distributed" + io, "orthogonalize --tp-mode duplicated" + io),
      "orthogonalize --tp-mode=duplicated where rank 0 has");
  expect_named(mpmd("orthogonalize --steps 5" + io, "orthogonalize --steps 4" + io),
               "orthogonalize --steps=4 where rank 0 has orthogonalize --steps=5");
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(CliMpmd, CalibrateLimitsDiffer) {
  const std::string out = " --sizes 32 --out " + (dir_ / "p.json").string();
  expect_named(mpmd("calibrate --max-bytes 4096" + out, "calibrate --max-bytes 8192" + out),
               "calibrate --max-bytes=8192");
  EXPECT_FALSE(fs::exists(dir_ / "p.json"));
}

// Every command, launched with one option differing between its two ranks: one error naming the
// option on every rank, well within the runner's 60 s limit.
TEST_F(CliMpmd, EveryCommandWithOneDifferingOption) {
  const fs::path in = dir_ / "g.npy";
  write_npy(in, test::random_matrix(32, 16, 3).view());
  const std::string io = " " + in.string() + " " + (dir_ / "o.npy").string();
  const std::string cal = " --sizes 32 --max-bytes 4096 --out " + (dir_ / "p.json").string();
  struct Case {
    std::string a, b, named;
  };
  const Case cases[] = {
      {"demo --rows 32 --cols 16", "demo --rows 64 --cols 16", "demo --rows=64"},
      {"orthogonalize" + io, "orthogonalize --coefficients cans" + io,
       "orthogonalize --coefficients=cans where rank 0 has orthogonalize --coefficients=(default"},
      {"plan --shape 64x64", "plan --shape 64x128", "plan --shape=64x128"},
      {"profiles", "profiles --json", "profiles --json="},
      {"topology", "topology --json", "topology --json="},
      {"calibrate --name a" + cal, "calibrate --name b" + cal, "calibrate --name=b"},
      {"bench --shape 64x64 --reps 1", "bench --shape 64x64 --reps 2", "bench --reps=2"},
      {train("--seed 1"), train("--seed 2"), "train --seed=2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.a);
    const auto t0 = std::chrono::steady_clock::now();
    expect_named(mpmd(c.a, c.b), c.named);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  }
}

TEST_F(CliMpmd, DifferentCommands) {
  expect_named(mpmd("demo --rows 32 --cols 16", "profiles"),
               "'distmuon profiles' where rank 0 runs 'distmuon demo'");
}

TEST_F(CliMpmd, TheSameDataPathNamingDifferentFiles) {
  // One relative path, two working directories (two nodes' copies of a data file that differ):
  // the same command line, different bytes. Before: each rank trained on its own data.
  for (const char* sub : {"a", "b"}) {
    fs::create_directories(dir_ / sub);
    std::ofstream(dir_ / sub / "text.txt") << std::string(3000, sub[0]) << "\n";
  }
  const std::string cmd = train("--data text.txt");
  expect_named(mpmd(cmd, cmd, true), "file train --data=text.txt: 3001 bytes, checksum ");
  // Named in the configuration (not on the command line): the trainer agrees on the bytes read.
  nlohmann::json config = test::tiny_training_config(dir_, 2);
  config["data"]["path"] = "text.txt";
  std::ofstream(dir_ / "rel.json") << config.dump();
  const std::string rel = "train --config " + (dir_ / "rel.json").string();
  const CliRun r = mpmd(rel, rel, true);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train: the configuration and the training data"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("first difference at /data/checksum"), std::string::npos) << r.output;
}

TEST_F(CliMpmd, TheSameConfigPathWithDifferentContents) {
  for (const char* sub : {"a", "b"}) {
    fs::create_directories(dir_ / sub);
    nlohmann::json config = test::tiny_training_config(dir_, sub == std::string("a") ? 2 : 3);
    std::ofstream(dir_ / sub / "c.json") << config.dump();
  }
  const CliRun r = mpmd("train --config c.json", "train --config c.json", true);
  expect_named(r, "file train --config=c.json: ");
}

TEST_F(CliMpmd, AParseErrorOnOneRankEndsEveryRank) {
  const CliRun r = mpmd("demo --rows 32 --cols 16", "demo --rows 32 --cols 16 --bogus");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the command line failed on rank(s) 1 of 2"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--bogus"), std::string::npos) << r.output;
}

TEST_F(CliMpmd, TheSameCommandLineRunsAndHelpStillWorks) {
  const CliRun ok = run_cli(2, "demo --rows 32 --cols 16 --reps 1", dir_ / "ok.txt");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("polar alignment"), std::string::npos) << ok.output;
  const CliRun help = run_cli(2, "demo --help", dir_ / "help.txt");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("--rows"), std::string::npos) << help.output;
}

}  // namespace
}  // namespace distmuon
