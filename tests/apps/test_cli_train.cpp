// `mpirun -np 2 distmuon train` with a tiny config: what it prints, the JSONL log, a checkpointed
// and resumed run that repeats the uninterrupted losses exactly, and bad options refused with a
// clear message.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class CliTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("distmuon_cli_train_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::string text;
    for (int i = 0; text.size() < 12000; ++i)
      text += (i * 7 % 5 == 0) ? "copies of the licence\n" : "free software for all ";
    std::ofstream(dir_ / "text.txt") << text;
    std::ofstream(dir_ / "tiny.json") << json{
        {"model", {{"context", 8}, {"embed", 8}, {"hidden", 16}, {"ffn", 128}, {"layers", 2}}},
        {"data", {{"path", (dir_ / "text.txt").string()}}},
        {"train",
         {{"steps", 6},
          {"batch", 32},
          {"log_every", 2},
          {"eval_every", 3},
          {"eval_windows", 128}}}};
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `distmuon train --config CONFIG ARGS` on 2 ranks under mpirun (without MPI, or with
  // ranks = 1: one process); returns the exit status.
  int train(const std::string& args, const std::string& config = "tiny.json", int ranks = 2) {
    const std::string mpirun(DISTMUON_MPIEXEC);
    const std::string launcher =
        mpirun.empty() || ranks == 1
            ? std::string()
            : mpirun + " -np " + std::to_string(ranks) + " --oversubscribe --bind-to none ";
    const std::string cmd = launcher + DISTMUON_CLI + " train --config " +
                            (dir_ / config).string() + " " + args + " >" + (dir_ / "out").string() +
                            " 2>&1";
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }
  std::string output() const {
    std::ifstream in(dir_ / "out");
    return {std::istreambuf_iterator<char>(in), {}};
  }
  std::vector<json> log(const std::string& name) const {
    std::vector<json> lines;
    std::ifstream in(dir_ / name);
    for (std::string line; std::getline(in, line);)
      lines.push_back(json::parse(line));
    return lines;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(CliTrain, TrainsPrintsAndLogs) {
  ASSERT_EQ(train("--log " + path("log.jsonl")), 0) << output();
  const std::string out = output();
  for (const char* needle :
       {"distmuon train: 2 ranks", "Muon weights by shape: rows sharded over 2 ranks",
        "blocks.*.fc1 (2)", "distributed", "step 2/6", "step 6/6", "val ", "tok/s", "(NS ",
        "final validation loss", "unigram entropy"}) {
    EXPECT_NE(out.find(needle), std::string::npos) << needle << "\n" << out;
  }
  const auto lines = log("log.jsonl");
  ASSERT_EQ(lines.size(), 6u);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].at("step"), i + 1);
    for (const char* key : {"loss", "opt_ms", "step_ms"})
      EXPECT_TRUE(lines[i].at(key).is_number()) << key;
    EXPECT_EQ(lines[i].contains("val_loss"), (i + 1) % 3 == 0) << lines[i];
  }
}

TEST_F(CliTrain, ResumedRunRepeatsTheLossesExactly) {
  ASSERT_EQ(train("--log " + path("full.jsonl")), 0) << output();
  ASSERT_EQ(train("--steps 3 --checkpoint " + path("ckpt") + " --log " + path("part.jsonl")), 0)
      << output();
  ASSERT_EQ(train("--resume " + path("ckpt") + " --log " + path("part.jsonl")), 0) << output();
  EXPECT_NE(output().find("resumed at step 3"), std::string::npos) << output();
  const auto full = log("full.jsonl"), part = log("part.jsonl");
  ASSERT_EQ(part.size(), full.size());
  for (std::size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(part[i].at("step"), full[i].at("step"));
    EXPECT_EQ(part[i].at("loss").get<double>(), full[i].at("loss").get<double>()) << i;
  }
  EXPECT_EQ(part.back().at("val_loss").get<double>(), full.back().at("val_loss").get<double>());
}

// --compare with --resume and --checkpoint naming the same folder: the comparison starts from the
// checkpoint the first run resumed from (step 3), not from the first run's last checkpoint (it
// trained 0 steps), and that checkpoint is still there although the first run's pruning would
// have removed it.
TEST_F(CliTrain, CompareAfterAResumeStartsWhereTheFirstRunStarted) {
  ASSERT_EQ(train("--steps 3 --checkpoint " + path("ckpt")), 0) << output();
  ASSERT_EQ(train("--resume " + path("ckpt") + " --checkpoint " + path("ckpt") +
                  " --checkpoint-every 1 --compare duplicated"),
            0)
      << output();
  const std::string out = output();
  std::size_t resumed = 0;
  for (auto p = out.find("resumed at step 3"); p != std::string::npos;
       p = out.find("resumed at step 3", p + 1))
    ++resumed;
  EXPECT_EQ(resumed, 2u) << out;
  const auto second = out.find("second run with tp-mode duplicated from the same start");
  ASSERT_NE(second, std::string::npos) << out;
  EXPECT_NE(out.find("step 6/6", second), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "step-00000006" / "trainer.json"));
}

// mpirun takes about 2 s to wind down a job that exits non-zero, so one failure runs on 2 ranks
// (every rank stops, one message) and the rest in one process.
TEST_F(CliTrain, BadOptionsFailWithAClearMessage) {
  auto expect_failure = [&](const std::string& args, const std::string& needle, int ranks = 1) {
    EXPECT_NE(train(args, "tiny.json", ranks), 0) << args;
    EXPECT_NE(output().find(needle), std::string::npos) << args << "\n" << output();
    EXPECT_EQ(output().find("step 1/"), std::string::npos) << "trained anyway: " << args;
  };
  expect_failure("--data " + path("missing.txt"), "missing.txt", 2);
  EXPECT_EQ(output().find("rank 1"), std::string::npos) << "one message: " << output();
  expect_failure("--tp-mode sideways", "sideways");
  expect_failure("--checkpoint-every 2", "--checkpoint");
  expect_failure("--compare auto", "already uses tp-mode auto");
  expect_failure("--profile no-such-gpu", "no-such-gpu");
  expect_failure("--resume " + path("nothing"), "holds no training checkpoint");
  expect_failure("--steps 0", "--steps");
  expect_failure("--plot " + path("no/such/folder/x.png"), "does not exist");
  std::ofstream(dir_ / "bad.json") << R"({"optimizer": {"lr": "fast"}})";
  EXPECT_NE(train("", "bad.json", 1), 0);
  EXPECT_NE(output().find("optimizer.lr"), std::string::npos) << output();
}

}  // namespace
