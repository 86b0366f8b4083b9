// The trainer at the test world's size: tp-mode auto against duplicated (loss parity), resume
// from a checkpoint (bit-exact), the JSONL log, and errors that every rank reports.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "distmuon/error.h"
#include "distmuon/trainer.h"
#include "test_util.h"
#include "train_test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::error_of;
using test::SharedDir;
using test::tiny_config;
using test::world;
using test::write_text;

double rel(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

// 1e-5 relative at every step: duplicated and distributed compute the Newton-Schulz of the same
// full matrix and differ only in fp32 summation order (~1e-7 per step); over 30 steps the losses
// drift apart by ~1e-7 (measured up to 9e-8 at 2 and 4 ranks). Blockwise changes the mathematics
// and is checked to differ by far more, so the comparison can fail.
TEST(Trainer, AutoMatchesDuplicatedLossesAtEveryStep) {
  SharedDir dir("trainer_parity");
  const fs::path text = write_text(dir.path());
  constexpr int kSteps = 30;
  auto losses = [&](const std::string& mode, const std::string& ns_algorithm,
                    std::vector<ShapeDecision>* decisions) {
    Trainer t(tiny_config(text, kSteps, mode, ns_algorithm), world());
    const TrainSummary s = run_training(t, {});
    if (decisions != nullptr) *decisions = t.decisions();
    return s;
  };
  // The default (standard NS): auto plans owner mode, which runs duplicated's NS on the same
  // bits, so the losses are equal, not merely close.
  std::vector<ShapeDecision> decisions, gram_decisions;
  const TrainSummary a = losses("auto", "standard", &decisions);
  const TrainSummary d = losses("duplicated", "standard", nullptr);
  // Opt-in (ns_algorithm auto): the cost model may pick Gram NS, within its fp32 error.
  const TrainSummary g = losses("auto", "auto", &gram_decisions);
  ASSERT_EQ(a.records.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(d.records.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(g.records.size(), static_cast<std::size_t>(kSteps));
  double worst = 0;
  for (int i = 0; i < kSteps; ++i) {
    const StepRecord& x = a.records[static_cast<std::size_t>(i)];
    const StepRecord& y = d.records[static_cast<std::size_t>(i)];
    const StepRecord& z = g.records[static_cast<std::size_t>(i)];
    EXPECT_EQ(x.step, i + 1);
    EXPECT_EQ(x.loss, y.loss) << "step " << x.step;
    EXPECT_EQ(x.val_loss, y.val_loss) << "step " << x.step;
    EXPECT_LE(rel(z.loss, y.loss), 1e-5) << "step " << z.step;
    EXPECT_EQ(z.val_loss.has_value(), y.val_loss.has_value());
    if (z.val_loss && y.val_loss) EXPECT_LE(rel(*z.val_loss, *y.val_loss), 1e-5);
    worst = std::max(worst, rel(z.loss, y.loss));
  }
  // Learning: well below the first loss after 30 steps.
  EXPECT_LT(a.final_val_loss, a.records.front().loss - 0.5);

  // The comparison is not vacuous: with sharded weights (and no profile: FLOPs) auto plans owner
  // mode for the bucket of every Muon weight; with ns_algorithm auto, Gram NS for some of them.
  ASSERT_EQ(decisions.size(), 3u);
  const auto fc1 = std::find_if(decisions.begin(), decisions.end(),
                                [](const ShapeDecision& s) { return s.m == 128 && s.n == 16; });
  ASSERT_NE(fc1, decisions.end());
  EXPECT_EQ(fc1->names, (std::vector<std::string>{"blocks.0.fc1", "blocks.1.fc1"}));
  if (world().size() > 1) {
    EXPECT_TRUE(fc1->sharded);
    for (const ShapeDecision& s : decisions) {
      EXPECT_EQ(s.mode, TpMode::kOwner) << s.m << "x" << s.n;
      EXPECT_EQ(s.algorithm, NsAlgorithm::kStandard) << s.m << "x" << s.n;
    }
    EXPECT_TRUE(
        std::any_of(gram_decisions.begin(), gram_decisions.end(),
                    [](const ShapeDecision& s) { return s.algorithm == NsAlgorithm::kGram; }));
    const TrainSummary b = losses("blockwise", "standard", nullptr);
    double blockwise = 0;
    for (std::size_t i = 0; i < b.records.size(); ++i)
      blockwise = std::max(blockwise, rel(b.records[i].loss, d.records[i].loss));
    EXPECT_GT(blockwise, 1e-3);
  } else {
    EXPECT_FALSE(fc1->sharded);
  }
  if (world().rank() == 0) {
    std::printf(
        "ranks %d: auto (ns_algorithm auto) vs duplicated, largest relative loss difference %.2g "
        "over %d steps\n",
        world().size(), worst, kSteps);
  }
}

// Data parallelism (train.weights replicated): every rank holds the Muon weights whole and Muon
// orthogonalises each on one home rank (replica_mode auto: the cost model, FLOPs without a
// profile, gives homes for these 5 weights); the losses equal every rank's NS bit for bit (the
// home runs the same NS on the same bits), and the run learns.
TEST(Trainer, ReplicatedWeightsOnHomesMatchEveryRankNsExactly) {
  SharedDir dir("trainer_replicated");
  const fs::path text = write_text(dir.path());
  constexpr int kSteps = 10;
  auto run = [&](const std::string& replica_mode, std::vector<ShapeDecision>* decisions) {
    TrainConfig c = tiny_config(text, kSteps);
    c.train.weights = "replicated";
    c.optimizer["replica_mode"] = replica_mode;
    Trainer t(c, world());
    const TrainSummary s = run_training(t, {});
    if (decisions != nullptr) *decisions = t.decisions();
    return s;
  };
  std::vector<ShapeDecision> decisions;
  const TrainSummary home = run("auto", &decisions);
  const TrainSummary every = run("every_rank", nullptr);
  ASSERT_EQ(home.records.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(every.records.size(), static_cast<std::size_t>(kSteps));
  for (std::size_t i = 0; i < home.records.size(); ++i)
    EXPECT_EQ(home.records[i].loss, every.records[i].loss) << "step " << i + 1;
  EXPECT_LT(home.records.back().loss, home.records.front().loss);
  for (const ShapeDecision& d : decisions) {
    EXPECT_FALSE(d.sharded);
    EXPECT_EQ(d.replicas, world().size());
    EXPECT_EQ(d.home, world().size() > 1) << d.m << "x" << d.n;
  }
}

// Bit for bit: the weights, the optimizer state (momentum, AdamW moments, step, auto decisions)
// and the data (a function of seed, step and rank) are the same, so every operation repeats.
TEST(Trainer, ResumeReproducesTheUninterruptedRunExactly) {
  SharedDir dir("trainer_resume");
  const fs::path text = write_text(dir.path());
  constexpr int kSteps = 12, kAt = 5;
  Trainer full(tiny_config(text, kSteps), world());
  TrainRunOptions full_run;
  full_run.log_jsonl = dir.path() / "full.jsonl";
  const TrainSummary a = run_training(full, full_run);

  TrainRunOptions first;
  first.checkpoint_dir = dir.path() / "ckpt";
  first.checkpoint_every = 2;  // steps 2 and 4, then the last (5)
  first.log_jsonl = dir.path() / "resumed.jsonl";
  {
    Trainer t(tiny_config(text, kAt), world());
    run_training(t, first);
  }
  // A later step is in the log (a run that went on past its last checkpoint): resume drops it.
  if (world().rank() == 0) {
    std::ofstream(first.log_jsonl, std::ios::app) << R"({"step": 6, "loss": 99.0})"
                                                  << "\n";
  }
  world().barrier();
  TrainRunOptions second;
  second.resume_dir = first.checkpoint_dir;
  second.log_jsonl = first.log_jsonl;
  Trainer t(tiny_config(text, kSteps), world());
  const TrainSummary b = run_training(t, second);

  EXPECT_EQ(b.first_step, kAt);
  ASSERT_EQ(b.records.size(), static_cast<std::size_t>(kSteps - kAt));
  for (const StepRecord& r : b.records) {
    const StepRecord& want = a.records[static_cast<std::size_t>(r.step - 1)];
    EXPECT_EQ(r.loss, want.loss) << "step " << r.step;
    EXPECT_EQ(r.val_loss, want.val_loss) << "step " << r.step;
  }
  EXPECT_EQ(b.final_val_loss, a.final_val_loss);
  EXPECT_EQ(t.optimizer().step_count(), kSteps);

  // The resumed log is the uninterrupted one, line for line in step, loss and val_loss.
  if (world().rank() == 0) {
    auto read = [](const fs::path& p) {
      std::vector<json> lines;
      std::ifstream in(p);
      for (std::string line; std::getline(in, line);)
        lines.push_back(json::parse(line));
      return lines;
    };
    const auto want = read(full_run.log_jsonl), got = read(second.log_jsonl);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i]["step"], want[i]["step"]);
      EXPECT_EQ(got[i]["loss"], want[i]["loss"]) << "line " << i;
      // The first run also measured the validation loss at its last step, kAt.
      if (got[i]["step"] != kAt)
        EXPECT_EQ(got[i].contains("val_loss"), want[i].contains("val_loss"));
      if (want[i].contains("val_loss")) EXPECT_EQ(got[i]["val_loss"], want[i]["val_loss"]);
    }
  }
}

// One object per step with the fields the log promises, values equal to the run's records
// (JSON doubles round-trip exactly), val_loss only on evaluation steps.
TEST(Trainer, JsonlLogHasOneRecordPerStep) {
  SharedDir dir("trainer_log");
  const fs::path text = write_text(dir.path());
  Trainer t(tiny_config(text, 6), world());
  TrainRunOptions run;
  run.log_jsonl = dir.path() / "log.jsonl";
  const TrainSummary s = run_training(t, run);
  if (world().rank() != 0) return;
  std::ifstream in(run.log_jsonl);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  ASSERT_EQ(lines.size(), 6u);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const json j = json::parse(lines[i]);
    const StepRecord& r = s.records[i];
    EXPECT_EQ(j.at("step").get<int>(), static_cast<int>(i) + 1);
    EXPECT_EQ(j.at("loss").get<double>(), r.loss);
    EXPECT_EQ(j.contains("val_loss"), r.step == 4 || r.step == 6) << lines[i];
    if (r.val_loss) EXPECT_EQ(j.at("val_loss").get<double>(), *r.val_loss);
    EXPECT_EQ(j.at("opt_ms").get<double>(), r.opt_ms);
    EXPECT_EQ(j.at("step_ms").get<double>(), r.step_ms);
    EXPECT_GT(r.step_ms, 0.0);
    EXPECT_GT(r.opt_ms, 0.0);
    EXPECT_LE(r.opt_ms, r.step_ms);
    EXPECT_LE(r.opt_comm_ms, r.opt_ms);
    EXPECT_EQ(lines[i].rfind(R"({"step":)", 0), 0u) << "step comes first: " << lines[i];
  }
}

TEST(Trainer, ErrorsAreReportedOnEveryRank) {
  SharedDir dir("trainer_errors");
  const fs::path text = write_text(dir.path());
  auto contains = [](const std::string& error, const std::string& needle) {
    EXPECT_NE(error.find(needle), std::string::npos) << error;
    EXPECT_EQ(error.find("(not collective)"), std::string::npos) << error;
  };
  contains(error_of([&] { Trainer t(tiny_config(dir.path() / "missing.txt", 3), world()); }),
           "missing.txt");
  if (world().size() > 1) {
    TrainConfig c = tiny_config(text, 3);
    c.train.batch = 32 * world().size() + 1;
    contains(error_of([&] { Trainer t(c, world()); }), "multiple of the");
  }
  Trainer t(tiny_config(text, 3), world());
  TrainRunOptions nothing_there;
  nothing_there.resume_dir = dir.path() / "no-such-checkpoint";
  contains(error_of([&] { run_training(t, nothing_there); }), "holds no training checkpoint");
  TrainRunOptions bad_log;
  bad_log.log_jsonl = dir.path() / "no-such-folder" / "log.jsonl";
  contains(error_of([&] { run_training(t, bad_log); }), "cannot open");

  // A checkpoint from another seed, and one whose model file was damaged.
  TrainRunOptions save;
  save.checkpoint_dir = dir.path() / "ckpt";
  {
    Trainer s(tiny_config(text, 2), world());
    run_training(s, save);
  }
  TrainConfig shorter = tiny_config(text, 1);
  Trainer w(shorter, world());
  TrainRunOptions resume_beyond;
  resume_beyond.resume_dir = save.checkpoint_dir;
  contains(error_of([&] { run_training(w, resume_beyond); }), "beyond the run's 1 steps");
  TrainConfig other_seed = tiny_config(text, 3);
  other_seed.train.seed = 12;
  Trainer u(other_seed, world());
  contains(error_of([&] { u.resume(save.checkpoint_dir); }), "train.seed");
  if (world().rank() == 0) {
    std::fstream f(save.checkpoint_dir / train_checkpoint_step_dir(2) / "model" / "rank-00000.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(17);
    const char c = static_cast<char>(f.get());
    f.seekp(17);
    f.put(static_cast<char>(c ^ 0x55));
  }
  world().barrier();
  Trainer v(tiny_config(text, 3), world());
  contains(error_of([&] { v.resume(save.checkpoint_dir); }), "checksum");
  EXPECT_EQ(v.step_count(), 0);

  // Options that make no sense are refused before anything runs.
  TrainRunOptions every_without_dir;
  every_without_dir.checkpoint_every = 2;
  EXPECT_THROW(run_training(v, every_without_dir), Error);
  EXPECT_EQ(v.step_count(), 0);
}

}  // namespace
}  // namespace distmuon
