// Training checkpoints that must not be written, mixed or lost: weights holding a NaN or an
// infinity on one rank (every rank refuses, nothing is written); a checkpoint folder holding
// another run's checkpoints (refused unless overwrite_checkpoints; resuming the same run goes
// on); a folder locked by another run; ranks naming different folders; an optimizer file of
// another run; a damaged trainer.json; a save that fails keeps the previous checkpoint.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/trainer.h"
#include "test_util.h"
#include "train_test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::error_of;
using test::read_text;
using test::SharedDir;
using test::tiny_config;
using test::world;
using test::write_text;

// The files under dir (relative path -> bytes) but the folder's lock file (its holder's pid);
// read by rank 0 only (empty elsewhere).
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  if (world().rank() != 0 || !fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != kFolderLockName)
      out[fs::relative(e.path(), dir).string()] = read_text(e.path());
  return out;
}

// The step folders under dir with the run id of each ("-" when it has no trainer.json).
std::map<std::string, std::string> runs_in(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory()) continue;
    const fs::path meta = e.path() / "trainer.json";
    out[e.path().filename().string()] =
        fs::exists(meta) ? json::parse(read_text(meta)).value("run_id", std::string()) : "-";
  }
  return out;
}

void expect_collective(const std::string& error, const std::string& needle) {
  EXPECT_NE(error.find(needle), std::string::npos) << error;
  EXPECT_EQ(error.find("(not collective)"), std::string::npos) << error;
}

// One NaN in one rank's shard of a Muon weight, then +Inf in a replicated AdamW weight on rank
// 0: every rank refuses the save, naming the weight and the rank, and the folder keeps the
// complete checkpoint it held (trainer.json included); a new folder is not even created.
TEST(TrainCheckpoint, NonFiniteWeightsAreNeverSaved) {
  SharedDir dir("train_ckpt_nonfinite");
  const fs::path text = write_text(dir.path());
  Trainer t(tiny_config(text, 4), world());
  t.step();
  const fs::path ckpt = dir.path() / "ckpt";
  t.save_checkpoint(ckpt);
  const auto saved = files_of(ckpt);
  if (world().rank() == 0) ASSERT_TRUE(saved.contains("trainer.json"));

  const int bad = world().size() - 1;
  ShardedParam* muon_weight = nullptr;
  ShardedParam* adamw_weight = nullptr;
  for (ShardedParam& p : t.model().params()) {
    if (p.sharded && !muon_weight) muon_weight = &p;
    if (!p.sharded && !adamw_weight) adamw_weight = &p;
  }
  ASSERT_TRUE(muon_weight && adamw_weight);
  const float saved_value = muon_weight->value(1, 2);
  if (world().rank() == bad) muon_weight->value(1, 2) = std::numeric_limits<float>::quiet_NaN();
  std::string e = error_of([&] { t.save_checkpoint(ckpt); });
  expect_collective(e, fmt::format("weight '{}' has a non-finite value at (1, 2) of rank {}'s",
                                   muon_weight->name, bad));
  EXPECT_TRUE(files_of(ckpt) == saved) << "the complete checkpoint was changed";
  e = error_of([&] { t.save_checkpoint(dir.path() / "fresh"); });
  expect_collective(e, "non-finite");
  world().barrier();
  EXPECT_FALSE(fs::exists(dir.path() / "fresh"));

  if (world().rank() == bad) muon_weight->value(1, 2) = saved_value;
  if (world().rank() == 0) adamw_weight->value(0, 0) = std::numeric_limits<float>::infinity();
  e = error_of([&] { t.save_checkpoint(ckpt); });
  expect_collective(e, fmt::format("weight '{}' has a non-finite value at (0, 0) of rank 0's",
                                   adamw_weight->name));
  EXPECT_TRUE(files_of(ckpt) == saved);
}

// Run A writes steps 2 and 4 into a folder. A new run B (another seed) into the same folder is
// refused on every rank before its first step, the folder unchanged; A resumed into its folder goes
// on and keeps its id; B with overwrite_checkpoints replaces A's checkpoints once its own first one
// is complete, and a resume of the folder then continues B, not A.
TEST(TrainCheckpoint, RunsDoNotShareACheckpointFolder) {
  SharedDir dir("train_ckpt_runs");
  const fs::path text = write_text(dir.path());
  const fs::path ckpt = dir.path() / "ckpt";
  TrainRunOptions a;
  a.checkpoint_dir = ckpt;
  a.checkpoint_every = 2;
  std::string id_a;
  {
    Trainer ta(tiny_config(text, 4), world());
    run_training(ta, a);
    id_a = ta.run_id();
  }
  ASSERT_EQ(id_a.size(), 16u);
  EXPECT_EQ(world().broadcast_string(id_a, 0), id_a) << "the ranks disagree on the run id";
  const auto saved = files_of(ckpt);

  TrainConfig other = tiny_config(text, 2);
  other.train.seed = 12;
  TrainRunOptions b;
  b.checkpoint_dir = ckpt;
  b.checkpoint_every = 2;
  {
    Trainer tb(other, world());
    EXPECT_NE(tb.run_id(), id_a);
    expect_collective(
        error_of([&] { run_training(tb, b); }),
        fmt::format("holds checkpoints of another run: step-00000004 (run '{}')", id_a));
    EXPECT_EQ(tb.step_count(), 0);
  }
  EXPECT_TRUE(files_of(ckpt) == saved);

  {  // the same run, resumed into its own folder
    Trainer tc(tiny_config(text, 6), world());
    TrainRunOptions c = a;
    c.resume_dir = ckpt;
    EXPECT_EQ(run_training(tc, c).first_step, 4);
    EXPECT_EQ(tc.run_id(), id_a);
  }
  if (world().rank() == 0) {
    EXPECT_EQ(runs_in(ckpt), (std::map<std::string, std::string>{{"step-00000004", id_a},
                                                                 {"step-00000006", id_a}}));
  }

  std::string id_b;
  {
    Trainer tb(other, world());
    b.overwrite_checkpoints = true;
    run_training(tb, b);
    id_b = tb.run_id();
  }
  if (world().rank() == 0)
    EXPECT_EQ(runs_in(ckpt), (std::map<std::string, std::string>{{"step-00000002", id_b}}));
  world().barrier();
  {
    TrainConfig longer = other;
    longer.train.steps = 3;
    Trainer td(longer, world());
    TrainRunOptions d;
    d.resume_dir = ckpt;
    EXPECT_EQ(run_training(td, d).first_step, 2);
    EXPECT_EQ(td.run_id(), id_b);
  }

  // Two runs' complete checkpoints in one folder (copied there by hand): resume refuses to pick.
  if (world().rank() == 0) {
    fs::copy(ckpt / "step-00000002", ckpt / "step-00000009", fs::copy_options::recursive);
    json meta = json::parse(read_text(ckpt / "step-00000009" / "trainer.json"));
    meta["run_id"] = "0123456789abcdef";
    std::ofstream(ckpt / "step-00000009" / "trainer.json") << meta.dump();
  }
  world().barrier();
  Trainer te(other, world());
  expect_collective(error_of([&] { te.resume(ckpt); }), "holds the checkpoints of 2 runs");
  EXPECT_EQ(te.step_count(), 0);
}

// Run A writes steps 4 and 6; resumed from its step-4 folder into the same folder and saving
// step 5, the run abandons A's step 6: once step 5 is complete, step 6 (the same run id, newer)
// is removed, so a later resume of the folder continues at step 5, not at the abandoned step 6.
TEST(TrainCheckpoint, AResumeFromAnOlderStepRemovesTheRunsNewerCheckpoints) {
  SharedDir dir("train_ckpt_older");
  const fs::path text = write_text(dir.path());
  const fs::path ckpt = dir.path() / "ckpt";
  TrainRunOptions a;
  a.checkpoint_dir = ckpt;
  a.checkpoint_every = 2;
  std::string id;
  {
    Trainer ta(tiny_config(text, 6), world());
    run_training(ta, a);
    id = ta.run_id();
  }
  if (world().rank() == 0) {
    ASSERT_EQ(runs_in(ckpt),
              (std::map<std::string, std::string>{{"step-00000004", id}, {"step-00000006", id}}));
  }
  world().barrier();
  {
    Trainer tb(tiny_config(text, 5), world());
    TrainRunOptions b;
    b.checkpoint_dir = ckpt;
    b.resume_dir = ckpt / "step-00000004";
    EXPECT_EQ(run_training(tb, b).first_step, 4);
    EXPECT_EQ(tb.run_id(), id);
  }
  if (world().rank() == 0) {
    EXPECT_EQ(runs_in(ckpt),
              (std::map<std::string, std::string>{{"step-00000004", id}, {"step-00000005", id}}));
  }
  world().barrier();
  Trainer tc(tiny_config(text, 6), world());
  tc.resume(ckpt);
  EXPECT_EQ(tc.step_count(), 5);
}

// A folder is written by one run at a time: while another holder has its lock (here a FolderLock
// of rank 0, as another process's run would hold it), a run is refused on every rank before its
// first step, naming the lock; once the lock is released the same run goes on.
TEST(TrainCheckpoint, AFolderLockedByAnotherRunIsRefused) {
  SharedDir dir("train_ckpt_lock");
  const fs::path text = write_text(dir.path());
  const fs::path ckpt = dir.path() / "ckpt";
  TrainRunOptions o;
  o.checkpoint_dir = ckpt;
  o.checkpoint_every = 2;
  {
    FolderLock other;
    if (world().rank() == 0) {
      fs::create_directories(ckpt);
      other = FolderLock(ckpt, "another run");
    }
    Trainer t(tiny_config(text, 2), world());
    expect_collective(
        error_of([&] { run_training(t, o); }),
        fmt::format("'{}' is in use by another run (process {} on host", ckpt.string(),
                    world().broadcast_string(std::to_string(::getpid()), 0)));
    EXPECT_EQ(t.step_count(), 0);
  }
  Trainer t(tiny_config(text, 2), world());
  run_training(t, o);
  if (world().rank() == 0)
    EXPECT_EQ(runs_in(ckpt), (std::map<std::string, std::string>{{"step-00000002", t.run_id()}}));
}

// Ranks naming different checkpoint folders (a path built from the rank): refused on every rank
// before anything is written, rank 0's folder and the first differing rank's named; the same for
// a direct save_checkpoint.
TEST(TrainCheckpoint, RanksNamingDifferentFoldersAreRefused) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  SharedDir dir("train_ckpt_ranks");
  const fs::path text = write_text(dir.path());
  TrainRunOptions o;
  o.checkpoint_dir = dir.path() / fmt::format("ckpt_{}", world().rank());
  o.checkpoint_every = 1;
  Trainer t(tiny_config(text, 2), world());
  std::string e = error_of([&] { run_training(t, o); });
  expect_collective(e, "the ranks name different folders");
  EXPECT_NE(e.find((dir.path() / "ckpt_0").string()), std::string::npos) << e;
  EXPECT_NE(e.find((dir.path() / "ckpt_1").string()), std::string::npos) << e;
  EXPECT_EQ(t.step_count(), 0);
  e = error_of([&] { t.save_checkpoint(o.checkpoint_dir); });
  expect_collective(e, "the ranks name different folders");
  world().barrier();
  for (int r = 0; r < world().size(); ++r)
    EXPECT_FALSE(fs::exists(dir.path() / fmt::format("ckpt_{}", r)));
}

// Every file of a step folder belongs to its run and step: the optimizer/ folder of another run
// at the same step (other optimizer options, so other moments), or one of its rank files, is
// refused on resume naming the file; the step count is unchanged. Restored, the resume goes on.
TEST(TrainCheckpoint, AnOptimizerFileOfAnotherRunIsRefused) {
  SharedDir dir("train_ckpt_swap");
  const fs::path text = write_text(dir.path());
  TrainRunOptions o;
  o.checkpoint_every = 2;
  o.checkpoint_dir = dir.path() / "a";
  {
    Trainer a(tiny_config(text, 2), world());
    run_training(a, o);
  }
  TrainConfig other = tiny_config(text, 2);
  other.optimizer["lr"] = 0.005;
  o.checkpoint_dir = dir.path() / "b";
  {
    Trainer b(other, world());
    run_training(b, o);
  }
  const fs::path step_a = dir.path() / "a" / "step-00000002";
  const fs::path step_b = dir.path() / "b" / "step-00000002";
  const fs::path kept = dir.path() / "kept-optimizer";
  const auto swap = [&](const fs::path& from, const fs::path& to) {
    if (world().rank() == 0) fs::copy(from, to, fs::copy_options::overwrite_existing);
    world().barrier();
  };
  if (world().rank() == 0) {
    fs::copy(step_a / "optimizer", kept, fs::copy_options::recursive);
    fs::remove_all(step_a / "optimizer");
    fs::copy(step_b / "optimizer", step_a / "optimizer", fs::copy_options::recursive);
  }
  world().barrier();
  {
    Trainer t(tiny_config(text, 4), world());
    expect_collective(error_of([&] { t.resume(step_a); }),
                      fmt::format("'{}' is not the optimizer state this checkpoint was saved with",
                                  (step_a / "optimizer" / "manifest.json").string()));
    EXPECT_EQ(t.step_count(), 0);
  }
  // The run's own optimizer folder but another run's rank file of the last rank.
  const std::string rank_file = fmt::format("rank-{:05d}.bin", world().size() - 1);
  if (world().rank() == 0) {
    fs::remove_all(step_a / "optimizer");
    fs::copy(kept, step_a / "optimizer", fs::copy_options::recursive);
  }
  world().barrier();
  swap(step_b / "optimizer" / rank_file, step_a / "optimizer" / rank_file);
  {
    Trainer t(tiny_config(text, 4), world());
    expect_collective(
        error_of([&] { t.resume(step_a); }),
        fmt::format("'{}' fails its checksum", (step_a / "optimizer" / rank_file).string()));
    EXPECT_EQ(t.step_count(), 0);
  }
  swap(kept / rank_file, step_a / "optimizer" / rank_file);
  Trainer t(tiny_config(text, 4), world());
  t.resume(step_a);
  EXPECT_EQ(t.step_count(), 2);
}

// A damaged trainer.json in the newest step folder is named as damaged (not "the checkpoints of
// 2 runs"), with the previous step folder to resume from; a missing one falls back to it.
TEST(TrainCheckpoint, ADamagedTrainerJsonIsNamed) {
  SharedDir dir("train_ckpt_damaged");
  const fs::path text = write_text(dir.path());
  const fs::path ckpt = dir.path() / "ckpt";
  TrainRunOptions o;
  o.checkpoint_dir = ckpt;
  o.checkpoint_every = 2;
  {
    Trainer a(tiny_config(text, 4), world());
    run_training(a, o);
  }
  const fs::path meta = ckpt / "step-00000004" / "trainer.json";
  if (world().rank() == 0) {
    const std::string good = read_text(meta);
    std::ofstream(meta, std::ios::trunc) << good.substr(0, good.size() / 2);
  }
  world().barrier();
  {
    Trainer t(tiny_config(text, 6), world());
    const std::string e = error_of([&] { t.resume(ckpt); });
    expect_collective(e, fmt::format("'{}' is damaged (", meta.string()));
    EXPECT_NE(
        e.find("resume from the previous step folder '" + (ckpt / "step-00000002").string() + "'"),
        std::string::npos)
        << e;
    EXPECT_EQ(e.find("runs"), std::string::npos) << e;
    EXPECT_EQ(t.step_count(), 0);
  }
  if (world().rank() == 0) fs::remove(meta);
  world().barrier();
  Trainer t(tiny_config(text, 6), world());
  t.resume(ckpt);
  EXPECT_EQ(t.step_count(), 2);
}

// A save that fails on one rank halfway (its model file over the file-size limit, SIGXFSZ
// ignored) into a folder holding a complete checkpoint: every rank throws, the folder keeps its
// checkpoint byte for byte, and no temporary file or staging folder is left.
TEST(TrainCheckpoint, AFailedSaveKeepsTheCompleteCheckpoint) {
  SharedDir dir("train_ckpt_failed");
  const fs::path text = write_text(dir.path());
  const fs::path ckpt = dir.path() / "ckpt";
  Trainer t(tiny_config(text, 4), world());
  t.step();
  t.save_checkpoint(ckpt);
  const auto saved = files_of(ckpt);
  t.step();
  const int bad = world().size() - 1;
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  if (world().rank() == bad) {
    struct rlimit small = old;
    small.rlim_cur = 64;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  }
  const std::string e = error_of([&] { t.save_checkpoint(ckpt); });
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
  expect_collective(e, "file-size limit");
  world().barrier();
  EXPECT_TRUE(files_of(ckpt) == saved) << "the complete checkpoint was changed";
  EXPECT_FALSE(fs::exists(dir.path() / ".ckpt.partial"));
  t.save_checkpoint(ckpt);
  if (world().rank() == 0) {
    EXPECT_FALSE(fs::exists(dir.path() / ".ckpt.partial"));
    EXPECT_EQ(json::parse(read_text(ckpt / "trainer.json")).at("step"), 2);
  }
}

}  // namespace
}  // namespace distmuon
