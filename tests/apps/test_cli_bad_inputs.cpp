// Bad inputs to the CLI under `mpirun -np 2` (docs/reliability.md has the whole table): each must
// fail on every rank within the time limit, with a message naming what is wrong, a non-zero exit,
// and no partial output (no output file; a checkpoint folder that held a good checkpoint still
// holds it, unchanged).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "cli_runner.h"
#include "distmuon/npy.h"
#include "test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::files_of;
using test::read_text;

class CliBadInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("distmuon_bad_inputs");
    write_npy(dir_ / "in.npy", test::random_matrix(16, 8, 3).view());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }

  // Runs `distmuon ARGS` on 2 ranks (np 0: one process without mpirun); expects a non-zero exit
  // naming `needle`, every rank ended by agreement (no MPI_ABORT: the ranks agreed on the error),
  // and no file `out` left behind. Returns the run.
  test::CliRun expect_refused(const std::string& args, const std::string& needle,
                              const std::string& out = {}, int np = 2) {
    const test::CliRun r = test::run_cli(np, args, dir_ / "log.txt");
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_NE(r.exit_code, 124) << "hung: " << args;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << "aborted: " << r.output;
    if (!out.empty()) EXPECT_FALSE(fs::exists(out)) << "partial output: " << out;
    return r;
  }

  // orthogonalize IN OUT with the input's bytes
  void expect_npy_refused(const std::string& bytes, const std::string& needle) {
    write("bad.npy", bytes);
    expect_refused(
        fmt::format("orthogonalize {} {} --tp-mode distributed", path("bad.npy"), path("out.npy")),
        needle, path("out.npy"));
  }

  fs::path dir_;
};

// ---- .npy inputs ----------------------------------------------------------------------------

TEST_F(CliBadInputs, EmptyNpy) {
  expect_npy_refused("", "bad magic");
}

TEST_F(CliBadInputs, NanNpy) {
  Matrix m = test::random_matrix(16, 8, 3);
  m(15, 7) = std::numeric_limits<float>::quiet_NaN();  // in the second rank's shard
  write_npy(dir_ / "nan.npy", m.view());
  expect_npy_refused(read_text(dir_ / "nan.npy"), "non-finite");
}

TEST_F(CliBadInputs, InfNpy) {
  Matrix m = test::random_matrix(16, 8, 3);
  m(0, 0) = -std::numeric_limits<float>::infinity();
  write_npy(dir_ / "inf.npy", m.view());
  expect_npy_refused(read_text(dir_ / "inf.npy"), "non-finite");
}

// A header claiming 4e9 x 4e9 floats over 24 bytes of data: refused, not allocated.
TEST_F(CliBadInputs, HugeNpyShape) {
  std::string good = read_text(dir_ / "in.npy");
  const std::string shape = "(16, 8)";
  const std::string huge = "(4000000000, 4000000000)";
  good.replace(good.find(shape), shape.size(), huge);
  expect_npy_refused(good, "truncated data");
}

// A header of 999999999999 x 0 (no data to bound it) used to pass and run out of memory.
TEST_F(CliBadInputs, EmptyNpyWithAHugeDimension) {
  std::string good = read_text(dir_ / "in.npy");
  const std::string shape = "(16, 8)";
  good.replace(good.find(shape), shape.size(), "(999999999999, 0)");
  expect_npy_refused(good, "an empty matrix of shape (999999999999, 0) is implausible");
}

// A negative dimension used to be read as positive by the header's regex.
TEST_F(CliBadInputs, NegativeNpyShape) {
  std::string good = read_text(dir_ / "in.npy");
  const std::string shape = "(16, 8)";
  good.replace(good.find(shape), shape.size(), "(16, -8)");
  expect_npy_refused(good, "negative dimension -8");
}

// ---- output paths that are not files ---------------------------------------------------------

// A folder, a FIFO or a device node given as an output is refused and left as it was (they used
// to be replaced by a regular file: renamed over, or removed before gnuplot wrote the PNG).
TEST_F(CliBadInputs, OutputThatIsAFolderOrAFifo) {
  fs::create_directories(dir_ / "folder");
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  const std::string in = path("in.npy");
  for (const std::string out : {"folder", "fifo"}) {
    SCOPED_TRACE(out);
    const std::string kind = out == "folder" ? "is a directory" : "is a FIFO";
    expect_refused(fmt::format("orthogonalize {} {}", in, path(out)), kind);
    expect_refused(fmt::format("plan --shape 64x64 -G 2 --map {}", path(out)), kind);
    EXPECT_TRUE(fs::is_directory(dir_ / "folder"));
    EXPECT_TRUE(fs::is_fifo(dir_ / "fifo"));
  }
}

// A character device (a copy of /dev/null made with mknod, so that the real one is never at risk):
// as root, `orthogonalize IN /dev/null` used to rename the result over the device node.
TEST_F(CliBadInputs, OutputThatIsADevice) {
  const fs::path null = dir_ / "null";
  if (::mknod(null.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) != 0)
    GTEST_SKIP() << "mknod of a character device needs root";
  expect_refused(fmt::format("orthogonalize {} {}", path("in.npy"), null.string()), "is a device");
  expect_refused(fmt::format("plan --shape 64x64 -G 2 --map {}", null.string()), "is a device");
  EXPECT_TRUE(fs::is_character_file(null));
}

// ---- option values out of range -------------------------------------------------------------

// Each option names its real range (CLI::PositiveNumber said "0 not in range 0.000000 to
// 1.797e308"; a uint64 seed beyond 2^64 - 1 was silently read as 2^64 - 1; demo --rows 0
// segfaulted; plan -G 0 and -G -4 were planned, -G 1000000000 ran out of memory).
TEST_F(CliBadInputs, OptionValuesOutOfRange) {
  const std::string int_max = std::to_string(std::numeric_limits<int>::max());
  const std::string index_max = std::to_string(std::numeric_limits<Index>::max());
  const std::string u64_max = std::to_string(std::numeric_limits<std::uint64_t>::max());
  const std::pair<std::string, std::string> cases[] = {
      {"demo --rows 0", "--rows: 0 is not an integer from 1 to " + index_max},
      {"demo --cols 0", "--cols: 0 is not an integer from 1 to " + index_max},
      {"demo --rows -3", "--rows: -3 is not an integer from 1 to " + index_max},
      {"demo --seed 4294967296", "--seed: 4294967296 is not an integer from 0 to 4294967295"},
      {"train --steps 0", "--steps: 0 is not an integer from 1 to " + int_max},
      {"train --seed 99999999999999999999",
       "--seed: 99999999999999999999 is not an integer from 0 to " + u64_max},
      {"bench --seed 18446744073709551616",
       "--seed: 18446744073709551616 is not an integer from 0 to " + u64_max},
      {"bench --reps 0", "--reps: 0 is not an integer from 1 to " + int_max},
      {"bench --plan-reps 0", "--plan-reps: 0 is not an integer from 1 to " + int_max},
      {"plan --shape 64x64 -G 0", "--group-size: 0 is not an integer from 1 to 1048576"},
      {"plan --shape 64x64 -G -4", "--group-size: -4 is not an integer from 1 to 1048576"},
      {"plan --shape 64x64 -G 1000000000",
       "--group-size: 1000000000 is not an integer from 1 to 1048576"},
  };
  // Every rank parses the same command line: one process shows the message (2 ranks: the first).
  int np = 2;
  for (const auto& [args, needle] : cases) {
    SCOPED_TRACE(args);
    expect_refused(args, needle, {}, np);
    np = 0;
  }
}

// Sizes that cannot fit are refused at once with the estimate (they ended in a bare
// std::bad_alloc after seconds of allocation, or in swapping).
TEST_F(CliBadInputs, SizesThatCannotFitInMemory) {
  json deep = {{"name", "deep"}, {"hidden", 256},     {"ffn", 1024},   {"heads", 4},
               {"kv_heads", 2},  {"layers", 1 << 24}, {"vocab", 1000}, {"gated_ffn", false}};
  write("deep.json", deep.dump());
  const std::pair<std::string, std::string> cases[] = {
      {"demo --rows 200000 --cols 200000", "demo of a 200000x200000 matrix needs about"},
      {"bench --shape 100000x100000", "bench of a 100000x100000 matrix (per rank) needs about"},
      {"plan -G 2 --model " + path("deep.json"), "plan: 67108864 Muon weights needs about"},
      {"bench --model " + path("deep.json"), "needs about"},
  };
  for (const auto& [args, needle] : cases) {
    SCOPED_TRACE(args);
    const auto t0 = std::chrono::steady_clock::now();
    const test::CliRun r = expect_refused(args, needle);
    EXPECT_NE(r.output.find("GiB of memory, more than the"), std::string::npos) << r.output;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30);
  }
}

// ---- hardware profiles (plan --profile FILE) --------------------------------------------------

class CliBadProfile : public CliBadInputs {
 protected:
  void SetUp() override {
    CliBadInputs::SetUp();
    profile_ = json::parse(read_text(fs::path(DISTMUON_PROFILES_DIR) / "h100.json"));
  }
  void expect_profile_refused(const json& j, const std::string& needle) {
    write("profile.json", j.dump());
    expect_refused("plan --model llama3-8b --group-size 2 --profile " + path("profile.json"),
                   needle);
  }
  json profile_;
};

TEST_F(CliBadProfile, WrongType) {
  profile_["domain_size"] = "eight";
  expect_profile_refused(profile_, "'domain_size'");
}
TEST_F(CliBadProfile, MissingField) {
  profile_.erase("inter_domain_gbps");
  expect_profile_refused(profile_, "'inter_domain_gbps'");
}
TEST_F(CliBadProfile, NegativeBandwidth) {
  profile_["intra_domain_gbps"] = -400;
  expect_profile_refused(profile_, "'intra_domain_gbps'");
}
TEST_F(CliBadProfile, ZeroPeak) {
  profile_["peak_tflops"]["fp32"] = 0;
  expect_profile_refused(profile_, "peak_tflops.fp32");
}
TEST_F(CliBadProfile, NotJson) {
  write("profile.json", profile_.dump().substr(0, 40));
  expect_refused("plan --model llama3-8b --group-size 2 --profile " + path("profile.json"),
                 "not valid JSON");
}

// ---- model presets (plan --model FILE) --------------------------------------------------------

class CliBadModel : public CliBadInputs {
 protected:
  json model_ = {{"name", "tiny"}, {"hidden", 256}, {"ffn", 1024},   {"heads", 4},
                 {"kv_heads", 2},  {"layers", 2},   {"vocab", 1000}, {"gated_ffn", false}};
  void expect_model_refused(const json& j, const std::string& needle) {
    write("model.json", j.dump());
    expect_refused("plan --group-size 2 --model " + path("model.json"), needle);
  }
};

TEST_F(CliBadModel, MissingField) {
  model_.erase("layers");
  expect_model_refused(model_, "'layers'");
}
TEST_F(CliBadModel, WrongType) {
  model_["hidden"] = "wide";
  expect_model_refused(model_, "'hidden'");
}
TEST_F(CliBadModel, ZeroSize) {
  model_["layers"] = 0;
  expect_model_refused(model_, "'layers' must be >= 1");
}
TEST_F(CliBadModel, NegativeSize) {
  model_["ffn"] = -1024;
  expect_model_refused(model_, "'ffn'");
}
TEST_F(CliBadModel, AbsurdSize) {
  model_["hidden"] = 1LL << 40;  // 1e12: a corrupt file, not a model
  expect_model_refused(model_, "'hidden' is 1099511627776, above the plausible maximum");
}

// ---- training config (train --config FILE) ----------------------------------------------------

class CliBadTrainConfig : public CliBadInputs {
 protected:
  void SetUp() override {
    CliBadInputs::SetUp();
    config_ = test::tiny_training_config(dir_, 2);
  }
  void expect_config_refused(const json& j, const std::string& needle) {
    write("config.json", j.dump());
    expect_refused("train --config " + path("config.json") + " --log " + path("log.jsonl"), needle,
                   path("log.jsonl"));
  }
  json config_;
};

TEST_F(CliBadTrainConfig, WrongType) {
  config_["train"]["steps"] = "many";
  expect_config_refused(config_, "train.steps");
}
TEST_F(CliBadTrainConfig, MissingDataFile) {
  config_["data"]["path"] = path("no-such-text.txt");
  expect_config_refused(config_, "no-such-text.txt");
}
TEST_F(CliBadTrainConfig, ZeroSize) {
  config_["model"]["embed"] = 0;
  expect_config_refused(config_, "model.embed");
}
TEST_F(CliBadTrainConfig, NegativeSize) {
  config_["train"]["batch"] = -8;
  expect_config_refused(config_, "train.batch");
}
TEST_F(CliBadTrainConfig, AbsurdSize) {
  config_["model"]["layers"] = 1 << 20;
  expect_config_refused(config_, "model.layers");
}
TEST_F(CliBadTrainConfig, NotJson) {
  write("config.json", config_.dump().substr(0, 30));
  expect_refused("train --config " + path("config.json"), "not valid JSON");
}

// A folder given as --plot or --log is refused before training and left as it was.
TEST_F(CliBadTrainConfig, PlotOrLogThatIsAFolder) {
  write("config.json", config_.dump());
  fs::create_directories(dir_ / "folder");
  const std::string train = "train --config " + path("config.json");
  expect_refused(train + " --plot " + path("folder"), "is a directory");
  expect_refused(train + " --log " + path("folder"), "is a directory");
  EXPECT_TRUE(fs::is_directory(dir_ / "folder"));
  EXPECT_TRUE(fs::is_empty(dir_ / "folder"));
}

// ---- checkpoints ------------------------------------------------------------------------------

// A training checkpoint written by 2 ranks, resumed by 1 or 4: the model's shards are per rank
// (no resharding), so the resume is refused and the checkpoint is left as it was.
TEST_F(CliBadTrainConfig, CheckpointFromAnotherRankCount) {
  write("config.json", config_.dump());
  const std::string train = "train --config " + path("config.json") + " ";
  ASSERT_EQ(test::run_cli(2, train + "--checkpoint " + path("ckpt"), dir_ / "log.txt").exit_code, 0)
      << read_text(dir_ / "log.txt");
  const auto saved = files_of(dir_ / "ckpt");
  for (int np : {1, 4}) {
    const test::CliRun r =
        test::run_cli(np, train + "--steps 3 --resume " + path("ckpt"), dir_ / "log.txt");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("written by 2 ranks, this run has " + std::to_string(np)),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("step 3/"), std::string::npos) << r.output;
  }
  EXPECT_TRUE(files_of(dir_ / "ckpt") == saved);
}

// The checkpoint folder cannot be created (its parent is a file): refused before any step.
TEST_F(CliBadTrainConfig, UnwritableCheckpointFolder) {
  write("config.json", config_.dump());
  write("a-file", "x");
  expect_refused("train --config " + path("config.json") + " --checkpoint " + path("a-file/ckpt"),
                 "a-file/ckpt");
  EXPECT_EQ(read_text(dir_ / "a-file"), "x");
}

// The disk fills up while a checkpoint is written: the checkpoint folder is a 128 KiB tmpfs and
// each rank's model file is 256 KiB, so write() fails with ENOSPC. Every rank stops with the
// write's error, no temporary file is left, and the step folder has no trainer.json (a resume
// would skip it). Mounting needs root (as CI runs); without it the test is skipped.
TEST_F(CliBadTrainConfig, DiskFullDuringCheckpoint) {
  json c = config_;
  c["model"]["ffn"] = 4096;  // fc1 and fc2: 2 x 16 x 4096 floats, half per rank
  write("config.json", c.dump());
  const fs::path mnt = dir_ / "small";
  fs::create_directories(mnt);
  if (std::system(fmt::format("mount -t tmpfs -o size=128k tmpfs '{}' 2>/dev/null", mnt.string())
                      .c_str()) != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs (not root?)";
  }
  const test::CliRun r = test::run_cli(
      2, "train --config " + path("config.json") + " --checkpoint " + (mnt / "ckpt").string(),
      dir_ / "log.txt");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("saving checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("final validation loss"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(mnt / "ckpt" / "step-00000002" / "trainer.json"));
  if (fs::exists(mnt / "ckpt")) {
    for (const auto& [name, bytes] : files_of(mnt / "ckpt"))
      EXPECT_EQ(name.find(".tmp"), std::string::npos) << "temporary left: " << name;
  }
  EXPECT_EQ(std::system(fmt::format("umount '{}'", mnt.string()).c_str()), 0);
}

}  // namespace
}  // namespace distmuon
