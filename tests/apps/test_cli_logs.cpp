// Logs and plots (docs/reliability.md, "Bad inputs", rows 166-169): a training log held by one
// run at a time, a log's last line cut short tolerated on resume, a write past the file-size
// limit reported instead of ending the process by SIGXFSZ, and a gnuplot that fails halfway
// leaving no truncated PNG.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class CliLogs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("distmuon_cli_logs");
    std::ofstream(dir_ / "tiny.json") << test::tiny_training_config(dir_, 3);
  }
  void TearDown() override { fs::remove_all(dir_); }
  test::CliRun train(int np, const std::string& args) {
    return checked(test::run_cli(np, fmt::format("train --config {} {}", path("tiny.json"), args),
                                 dir_ / "out.log"));
  }
  // Every message speaks to the user: no library or type name, no exception text of the
  // standard library or the JSON parser, no crash report.
  static test::CliRun checked(test::CliRun run) {
    for (const char* internal : {"std::", "json.exception", "basic_filebuf", "bad_alloc",
                                 "what():", "terminate called", "This should be caught"}) {
      EXPECT_EQ(run.output.find(internal), std::string::npos) << internal << " in:\n" << run.output;
    }
    return run;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<int> logged_steps(const std::string& name) const {
    std::vector<int> steps;
    std::ifstream in(dir_ / name);
    for (std::string line; std::getline(in, line);)
      steps.push_back(json::parse(line).at("step").get<int>());
    return steps;
  }
  fs::path dir_;
};

// Another run holds the log (its lock file locked, as a run in progress holds it): a run naming
// the same log is refused at once, and the log is not touched.
TEST_F(CliLogs, ALogHeldByAnotherRunIsRefused) {
  std::ofstream(dir_ / "log.jsonl") << "";
  const int fd = ::open(path("log.jsonl.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const auto run = train(2, "--log " + path("log.jsonl"));
  ::close(fd);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("is in use by another run"), std::string::npos) << run.output;
  EXPECT_EQ(fs::file_size(dir_ / "log.jsonl"), 0u);
  // Released: the same command runs.
  EXPECT_EQ(train(2, "--log " + path("log.jsonl")).exit_code, 0);
  EXPECT_EQ(logged_steps("log.jsonl"), (std::vector<int>{1, 2, 3}));
}

// A run stopped while writing its log's last line (a full disk): the resumed run drops that line
// with a warning and continues the log.
TEST_F(CliLogs, ALastLineCutShortIsDroppedOnResume) {
  ASSERT_EQ(
      train(2, "--steps 2 --checkpoint " + path("ckpt") + " --log " + path("log.jsonl")).exit_code,
      0);
  std::ofstream(dir_ / "log.jsonl", std::ios::app) << R"({"step": 3, "loss": 4.)";
  const auto run = train(2, "--resume " + path("ckpt") + " --log " + path("log.jsonl"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("dropping its last line"), std::string::npos) << run.output;
  EXPECT_EQ(logged_steps("log.jsonl"), (std::vector<int>{1, 2, 3}));
}

// `ulimit -f 4` (4 KiB; the log of 100 steps holds about 9): the log's write fails with an error
// naming the file, not SIGXFSZ (exit status 153 from the shell) halfway through a line.
TEST_F(CliLogs, AFileSizeLimitIsReportedNotASignal) {
  const auto run = checked(test::run_cli(
      0,
      fmt::format("--version >/dev/null; ulimit -f 4; exec {} train --config {} --steps 100 "
                  "--log-interval 100 --eval-interval 100 --log {}",
                  DISTMUON_CLI, path("tiny.json"), path("log.jsonl")),
      dir_ / "out.log"));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("cannot write '" + path("log.jsonl") + "'"), std::string::npos)
      << run.output;
}

// A gnuplot that writes part of its PNG and fails: the named PNG does not exist afterwards.
TEST_F(CliLogs, AFailedGnuplotLeavesNoTruncatedPng) {
  fs::create_directories(dir_ / "bin");
  std::ofstream(dir_ / "bin" / "gnuplot")
      << "#!/bin/sh\nout=$(sed -n \"s/^set output '\\(.*\\)'$/\\1/p\" \"$1\")\n"
         "printf 'PNG partial' > \"$out\"\necho 'gnuplot: out of memory' >&2\nexit 1\n";
  fs::permissions(dir_ / "bin" / "gnuplot", fs::perms::owner_all);
  const auto run =
      checked(test::run_cli(0, "plan --shape 64x32 -G 2 --map " + path("map.png"), dir_ / "out.log",
                            fmt::format("PATH={}:$PATH", (dir_ / "bin").string())));
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("out of memory"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(dir_ / "map.png"));
}

}  // namespace
}  // namespace distmuon
