// Fault injection (docs/reliability.md): `mpirun -np 2 distmuon train` with checkpoints, one rank
// made to throw, exit or be killed (DISTMUON_FAULT) in the middle of an optimizer step, between
// the files of a checkpoint and in a collective. Each run must end within a bounded time on
// every rank with a non-zero status and the failing rank named, and the last complete checkpoint
// must resume to exactly the uninterrupted run (its losses bit for bit, its files byte for byte).
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using distmuon::test::read_text;
using nlohmann::json;

constexpr int kSteps = 6;          // checkpoints at steps 2, 4 and 6
constexpr int kLimitSeconds = 60;  // a run that takes longer hangs (a healthy one takes ~2 s)
// The collective on which the collective faults fire: the 200th lands in step 3 of this config
// (every MPI collective counts: the Gram all-reduce of each NS step, agreements, the training
// loop's reductions; the step-2 checkpoint is complete by the 150th).
constexpr int kCollectiveN = 200;

using RunResult = distmuon::test::CommandRun;

std::vector<json> read_log(const fs::path& p) {
  std::vector<json> lines;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);)
    lines.push_back(json::parse(line));
  return lines;
}

// The files of a directory (relative path -> bytes), to compare two checkpoints byte for byte;
// trainer.json without its run id (two runs differ in it, and only in it).
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::string bytes = read_text(e.path());
    if (e.path().filename() == "trainer.json") {
      json meta = json::parse(bytes);
      EXPECT_TRUE(meta.contains("run_id")) << e.path();
      meta.erase("run_id");
      bytes = meta.dump(2);
    }
    out[fs::relative(e.path(), dir).string()] = bytes;
  }
  return out;
}

class CliFaults : public ::testing::Test {
 protected:
  // One uninterrupted run for the whole suite: its log and its checkpoints are the reference.
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("distmuon_cli_faults_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string text;
    for (int i = 0; text.size() < 12000; ++i)
      text += (i * 7 % 5 == 0) ? "copies of the licence\n" : "free software for all ";
    std::ofstream(dir_ / "text.txt") << text;
    std::ofstream(dir_ / "tiny.json") << json{
        {"model", {{"context", 8}, {"embed", 8}, {"hidden", 16}, {"ffn", 128}, {"layers", 2}}},
        {"data", {{"path", (dir_ / "text.txt").string()}}},
        {"train",
         {{"steps", kSteps},
          {"batch", 32},
          {"log_every", 1},
          {"eval_every", 3},
          {"eval_windows", 64}}},
        {"optimizer", {{"tp_mode", "distributed"}}}};  // a collective per NS step
    reference_ = train("", "--checkpoint-every 2 --checkpoint " + (dir_ / "ref").string() +
                               " --log " + (dir_ / "ref.jsonl").string());
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // `mpirun -np 2 distmuon train --config tiny.json ARGS` with DISTMUON_FAULT=fault (none when
  // empty), killed after kLimitSeconds.
  static RunResult train(const std::string& fault, const std::string& args,
                         const std::string& output = "out.txt") {
    const fs::path log = dir_ / output;
    const std::string env = fault.empty() ? "" : "DISTMUON_FAULT=" + fault + " ";
    const std::string cmd = fmt::format(
        "{}timeout -k 5 {} {} -np 2 --oversubscribe --bind-to none -x DISTMUON_FAULT --mca "
        "odls_base_sigkill_timeout 0 {} train --config {} {}",
        env, kLimitSeconds, DISTMUON_MPIEXEC, DISTMUON_CLI, (dir_ / "tiny.json").string(), args);
    return distmuon::test::run_command(cmd, log);
  }

  void SetUp() override {
    ASSERT_EQ(reference_.exit_code, 0) << reference_.output;
    work_ = dir_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(work_);
    fs::create_directories(work_);
  }
  std::string ckpt() const { return (work_ / "ckpt").string(); }
  std::string log() const { return (work_ / "run.jsonl").string(); }

  // Runs with the fault; expects a bounded failure that names rank `rank`.
  RunResult expect_failure(const std::string& fault, int rank) {
    const RunResult r =
        train(fault, "--checkpoint-every 2 --checkpoint " + ckpt() + " --log " + log());
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "timed out: a rank hung\n" << r.output;
    EXPECT_LT(r.seconds, kLimitSeconds) << r.output;
    // mpirun's own report names the process: "process rank 1" (a signal) or "Process name:
    // [[job,1],1]" (an exit status); the CLI's "error on rank 1" (an exception).
    const std::regex named(fmt::format(
        R"(process rank {0}\b|Process name: \[\[[0-9]+,[0-9]+\],{0}\]|error on rank {0}:)", rank));
    EXPECT_TRUE(std::regex_search(r.output, named)) << "failing rank not named\n" << r.output;
    EXPECT_EQ(r.output.find("final validation loss"), std::string::npos) << r.output;
    return r;
  }

  // The checkpoint folder's newest complete step is `step` and equals the reference's files; a
  // resume from it repeats the uninterrupted run's losses exactly.
  void expect_resumes_exactly(int step) {
    const fs::path complete = work_ / "ckpt" / fmt::format("step-{:08d}", step);
    ASSERT_TRUE(fs::exists(complete / "trainer.json")) << complete;
    const fs::path ref = dir_ / "ref" / fmt::format("step-{:08d}", step);
    if (fs::exists(ref)) EXPECT_TRUE(files_of(complete) == files_of(ref)) << "files differ";
    const RunResult r = train("", "--resume " + ckpt() + " --log " + log());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(fmt::format("resumed at step {}", step)), std::string::npos)
        << r.output;
    const auto full = read_log(dir_ / "ref.jsonl"), part = read_log(log());
    ASSERT_EQ(part.size(), full.size());
    for (std::size_t i = 0; i < full.size(); ++i) {
      EXPECT_EQ(part[i].at("step"), full[i].at("step"));
      EXPECT_EQ(part[i].at("loss").get<double>(), full[i].at("loss").get<double>()) << i;
    }
  }

  static fs::path dir_;
  static RunResult reference_;
  fs::path work_;
};

fs::path CliFaults::dir_;
RunResult CliFaults::reference_;

// Half of the parameters updated at step 5, then rank 1 throws: the CLI names it and aborts.
TEST_F(CliFaults, ThrowInOptimizerStep) {
  const RunResult r = expect_failure("1:optim-step:throw:5", 1);
  EXPECT_NE(r.output.find("injected fault 'optim-step' on rank 1"), std::string::npos) << r.output;
  expect_resumes_exactly(4);
}

// An allocation failing on rank 1 in step 3 (past the size estimates): the CLI says it ran out of
// memory in plain words (not a bare std::bad_alloc), every rank ends, the checkpoint survives.
TEST_F(CliFaults, OutOfMemoryInOptimizerStep) {
  const RunResult r = expect_failure("1:optim-step:oom:3", 1);
  EXPECT_NE(r.output.find("error on rank 1: distmuon train ran out of memory (an allocation "
                          "failed): use smaller sizes or more memory"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("bad_alloc"), std::string::npos) << r.output;
  expect_resumes_exactly(2);
}

// stdout into a file (here through mpirun's forwarding pipe) is line-buffered: rank 0 killed by
// SIGKILL in step 5 leaves the lines of steps 1-4 in the file (block-buffered, these few hundred
// bytes would still sit in the dead process's buffer).
TEST_F(CliFaults, AKilledRunKeepsWhatItPrinted) {
  const RunResult r = expect_failure("0:optim-step:kill:5", 0);
  for (int step = 1; step <= 4; ++step) {
    const std::regex line(fmt::format(R"(step +{}/{}  loss)", step, kSteps));
    EXPECT_TRUE(std::regex_search(r.output, line)) << step << "\n" << r.output;
  }
}

// Rank 0 ends at once (no unwinding, no MPI_Finalize) in the middle of step 3.
TEST_F(CliFaults, ExitInOptimizerStep) {
  expect_failure("0:optim-step:exit:3", 0);
  expect_resumes_exactly(2);
}

// kill -9 of rank 1 between the model file and the optimizer's files of the step-6 checkpoint:
// the half-written save stays in its staging folder (.step-00000006.partial), step-00000006
// never appears, and the resume goes on from step 4.
TEST_F(CliFaults, KillBetweenCheckpointFiles) {
  const RunResult r = expect_failure("1:checkpoint-between-files:kill:3", 1);
  EXPECT_TRUE(fs::exists(work_ / "ckpt" / ".step-00000006.partial" / "model")) << r.output;
  EXPECT_FALSE(fs::exists(work_ / "ckpt" / "step-00000006")) << r.output;
  expect_resumes_exactly(4);
}

// A throw between the files of the step-4 checkpoint: a rank-local error, so the job aborts.
TEST_F(CliFaults, ThrowBetweenCheckpointFiles) {
  expect_failure("0:checkpoint-between-files:throw:2", 0);
  EXPECT_FALSE(fs::exists(work_ / "ckpt" / "step-00000004" / "trainer.json"));
  expect_resumes_exactly(2);
}

// Rank 1 is killed on its way into an all-reduce while rank 0 waits inside it (step 3 or later).
TEST_F(CliFaults, KillDuringCollective) {
  expect_failure(fmt::format("1:collective:kill:{}", kCollectiveN), 1);
  expect_resumes_exactly(2);
}

// Rank 0 throws instead of entering an all-reduce; rank 1 is inside it.
TEST_F(CliFaults, ThrowDuringCollective) {
  expect_failure(fmt::format("0:collective:throw:{}", kCollectiveN), 0);
  expect_resumes_exactly(2);
}

// A newer step folder without trainer.json (a save that never finished; here: the step-6 files
// of the reference but its trainer.json) is skipped with a warning.
TEST_F(CliFaults, HalfWrittenNewerStepIsSkipped) {
  fs::create_directories(work_ / "ckpt");
  fs::copy(dir_ / "ref" / "step-00000004", work_ / "ckpt" / "step-00000004",
           fs::copy_options::recursive);
  fs::copy(dir_ / "ref" / "step-00000006", work_ / "ckpt" / "step-00000006",
           fs::copy_options::recursive);
  fs::remove(work_ / "ckpt" / "step-00000006" / "trainer.json");
  // The reference's log up to step 4, as a run killed while saving step 6 would leave it.
  {
    std::ofstream out(log());
    for (const json& line : read_log(dir_ / "ref.jsonl"))
      if (line.at("step").get<int>() <= 4) out << line.dump() << "\n";
  }
  const RunResult r = train("", "--checkpoint-every 2 --checkpoint " + ckpt() + " --resume " +
                                    ckpt() + " --log " + log());
  EXPECT_NE(r.output.find("skipping"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step-00000006"), std::string::npos) << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed at step 4"), std::string::npos) << r.output;
  const auto full = read_log(dir_ / "ref.jsonl"), part = read_log(log());
  ASSERT_EQ(part.size(), full.size());
  for (std::size_t i = 0; i < full.size(); ++i)
    EXPECT_EQ(part[i].at("loss").get<double>(), full[i].at("loss").get<double>()) << i;
  // The finished run completed step 6 again and kept step 4 as the previous checkpoint.
  EXPECT_TRUE(fs::exists(work_ / "ckpt" / "step-00000006" / "trainer.json"));
  EXPECT_TRUE(files_of(work_ / "ckpt" / "step-00000006") ==
              files_of(dir_ / "ref" / "step-00000006"));
}

// The files of a folder byte for byte (relative path -> bytes), trainer.json with its run id.
std::map<std::string, std::string> raw_files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_text(e.path());
  return out;
}

// The files under dir whose name holds ".tmp." (a temporary of an atomic write).
std::vector<std::string> temporaries_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos)
      out.push_back(e.path().string());
  return out;
}

// --overwrite-checkpoints: run A's only checkpoint is step 2; a new run B into the folder dies
// while writing its own step 2 (rank 1 killed between the model file and the optimizer's; rank
// 0 killed halfway through trainer.json). A's step 2 stays byte for byte (run id included), B's
// partial files stay in the staging folder, and A resumed into the folder goes on (the lock of
// the killed run is gone with it).
TEST_F(CliFaults, OverwriteThatDiesWhileSavingKeepsTheOldCheckpoint) {
  const RunResult a = train("", "--steps 2 --checkpoint-every 2 --checkpoint " + ckpt());
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const fs::path step2 = work_ / "ckpt" / "step-00000002";
  const auto saved = raw_files_of(step2);
  ASSERT_TRUE(saved.contains("trainer.json"));
  for (const std::string fault : {"1:checkpoint-between-files:kill:1", "0:file-write:kill:4"}) {
    const RunResult b =
        train(fault, "--overwrite-checkpoints --checkpoint-every 2 --checkpoint " + ckpt());
    EXPECT_NE(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("injected fault"), std::string::npos) << b.output;
    EXPECT_TRUE(raw_files_of(step2) == saved) << fault << ": the old checkpoint was changed";
    EXPECT_TRUE(fs::exists(work_ / "ckpt" / ".step-00000002.partial")) << fault;
  }
  const RunResult r = train("", "--steps 4 --checkpoint-every 2 --checkpoint " + ckpt() +
                                    " --resume " + ckpt() + " --log " + log());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed at step 2"), std::string::npos) << r.output;
  EXPECT_EQ(json::parse(read_text(work_ / "ckpt" / "step-00000004" / "trainer.json")).at("run_id"),
            json::parse(saved.at("trainer.json")).at("run_id"));
  EXPECT_FALSE(fs::exists(work_ / "ckpt" / ".step-00000002.partial"));  // pruned
}

// A rank whose atomic write fails halfway (an exception in write_file_atomic on rank 1, as a
// full disk or EFBIG would raise, here in its model file of the step-2 save): every rank reports
// the save failed on rank 1, no temporary file and no staging folder is left.
TEST_F(CliFaults, AFailedWriteLeavesNoTemporary) {
  const RunResult r = train("1:file-write:throw:1", "--checkpoint-every 2 --checkpoint " + ckpt());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, kLimitSeconds) << r.output;
  EXPECT_NE(r.output.find("failed on rank(s) 1 of 2: injected fault 'file-write' on rank 1"),
            std::string::npos)
      << r.output;
  const std::vector<std::string> left = temporaries_in(work_);
  EXPECT_TRUE(left.empty()) << left.front();
  EXPECT_FALSE(fs::exists(work_ / "ckpt" / "step-00000002"));
  EXPECT_FALSE(fs::exists(work_ / "ckpt" / ".step-00000002.partial"));
}

// The folder's lock held by another process (this test, as a running run holds it): a run into
// the folder is refused before its first step, naming the lock; once released, the run goes on.
TEST_F(CliFaults, ALockedCheckpointFolderIsRefused) {
  fs::create_directories(work_ / "ckpt");
  const fs::path lock_file = work_ / "ckpt" / ".lock";
  const int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const RunResult r = train("", "--checkpoint-every 2 --checkpoint " + ckpt());
  ::close(fd);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("is in use by another run"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(lock_file.string()), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("final validation loss"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(work_ / "ckpt" / "step-00000002"));
  const RunResult again = train("", "--checkpoint-every 2 --checkpoint " + ckpt());
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

// Two runs launched into one folder at the same moment: exactly one trains; the other is refused
// (the folder is locked, or, when it starts after the first ended, it holds another run's
// checkpoints). The folder holds the winner's checkpoints only, and they resume.
TEST_F(CliFaults, TwoRunsStartedIntoOneFolderAtOnce) {
  RunResult first, second;
  const std::string args = "--checkpoint-every 2 --checkpoint " + ckpt();
  std::thread t1([&] { first = train("", args, "first.txt"); });
  std::thread t2([&] { second = train("", args, "second.txt"); });
  t1.join();
  t2.join();
  ASSERT_EQ((first.exit_code == 0) + (second.exit_code == 0), 1) << first.output << "\n----\n"
                                                                 << second.output;
  const RunResult& lost = first.exit_code == 0 ? second : first;
  EXPECT_TRUE(lost.output.find("is in use by another run") != std::string::npos ||
              lost.output.find("holds checkpoints of another run") != std::string::npos)
      << lost.output;
  std::set<std::string> ids;
  for (const auto& e : fs::directory_iterator(work_ / "ckpt"))
    if (e.is_directory())
      ids.insert(json::parse(read_text(e.path() / "trainer.json")).at("run_id").get<std::string>());
  EXPECT_EQ(ids.size(), 1u);
  const RunResult r = train("", "--resume " + ckpt() + " --log " + log());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(fmt::format("resumed at step {}", kSteps)), std::string::npos)
      << r.output;
}

// The reference run kept its last two checkpoints only.
TEST_F(CliFaults, OlderCheckpointsArePruned) {
  EXPECT_FALSE(fs::exists(dir_ / "ref" / "step-00000002"));
  EXPECT_TRUE(fs::exists(dir_ / "ref" / "step-00000004" / "trainer.json"));
  EXPECT_TRUE(fs::exists(dir_ / "ref" / "step-00000006" / "trainer.json"));
}

// A malformed DISTMUON_FAULT is an error, not a silently healthy run.
TEST_F(CliFaults, MalformedFaultSpecIsAnError) {
  const RunResult r = train("1:nowhere", "--log " + log());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("DISTMUON_FAULT"), std::string::npos) << r.output;
}

}  // namespace
