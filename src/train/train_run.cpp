// run_training: the loop over steps with evaluations, checkpoints, the JSONL log and observers.
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "distmuon/agreement.h"
#include "distmuon/checkpoint.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/json_file.h"
#include "distmuon/text_data.h"
#include "distmuon/trainer.h"
#include "train/trainer_impl.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The JSONL log, open on rank 0 only. Each line is written with one call and flushed.
class JsonlLog {
 public:
  // Truncates the file, or (resume) keeps its lines of steps <= keep_through and appends. The
  // log is held by one run at a time: "<log>.lock" is locked (FolderLock) before the log is read
  // or truncated, so a second run naming the same log at once is refused instead of
  // interleaving its lines. A last line cut short (a run that stopped while writing it, a full
  // disk) is dropped with a warning; any other line that is no step record is refused.
  void open(const fs::path& path, int keep_through) {
    check_output_file(path, "train log");
    lock_ = FolderLock::of_file(fs::path(path.string() + ".lock"), path, "train log");
    path_ = path;
    if (keep_through > 0 && fs::exists(path)) {
      const std::string text = read_text_file(path, "train log", kMaxTextDataBytes);
      std::string kept;
      for (std::size_t start = 0; start < text.size();) {
        const std::size_t end = std::min(text.find('\n', start), text.size());
        const std::string line = text.substr(start, end - start);
        const bool last_unterminated = end == text.size();
        start = end + 1;
        if (line.empty()) continue;
        const json record = json::parse(line, nullptr, false);
        const bool is_record =
            record.is_object() && record.contains("step") && record.at("step").is_number_integer();
        if (!is_record && last_unterminated) {
          spdlog::warn("train log '{}': dropping its last line, cut short while it was written: {}",
                       path.string(), line.substr(0, 80));
          continue;
        }
        if (!is_record) {
          throw Error(fmt::format("train log '{}': a line is not a step record: {}", path.string(),
                                  line.substr(0, 200)));
        }
        if (record.at("step").get<int>() > keep_through) continue;
        kept += line + "\n";
      }
      write_file_atomic(path, kept.data(), kept.size());
      file_ = std::fopen(path.c_str(), "a");
    } else {
      file_ = std::fopen(path.c_str(), "w");
    }
    if (file_ == nullptr) {
      throw Error(
          fmt::format("train log: cannot open '{}': {}", path.string(), std::strerror(errno)));
    }
  }
  ~JsonlLog() {
    if (file_ != nullptr) std::fclose(file_);
  }
  bool is_open() const { return file_ != nullptr; }

  void write(const StepRecord& r) {
    nlohmann::ordered_json j = {{"step", r.step}, {"loss", r.loss}};
    if (r.val_loss) j["val_loss"] = *r.val_loss;
    j["opt_ms"] = r.opt_ms;
    j["opt_comm_ms"] = r.opt_comm_ms;
    j["step_ms"] = r.step_ms;
    const std::string line = j.dump() + "\n";
    if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0) {
      throw Error(
          fmt::format("train log: cannot write '{}': {}", path_.string(), std::strerror(errno)));
    }
  }

 private:
  FolderLock lock_;  // on "<log>.lock", while the log is open
  fs::path path_;
  std::FILE* file_ = nullptr;
};

// Flushes denormal floats to zero on this thread while training runs, as ML frameworks do:
// late in training, softmax tails and their gradients underflow into denormals, and x86 cores
// handle those in microcode (the default run's steps grew from ~90 ms to ~250 ms of
// forward/backward without it). Restores the caller's mode on exit.
class FlushDenormals {
 public:
#if defined(__SSE2__)
  FlushDenormals() : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ | kFtz | kDaz);
  }
  ~FlushDenormals() {
    _mm_setcsr(saved_);
  }

 private:
  static constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;
  unsigned saved_;
#endif
};

bool due(int step, int every) {
  return every > 0 && step % every == 0;
}

// The step folders in dir, newest first.
std::vector<std::pair<int, fs::path>> step_folders(const fs::path& dir) {
  std::vector<std::pair<int, fs::path>> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int step = 0;
    if (std::sscanf(name.c_str(), "step-%d", &step) == 1 && name == train_checkpoint_step_dir(step))
      out.emplace_back(step, it->path());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// Rank 0, before the first step: the complete checkpoints in dir that another run wrote (another
// run id), as "step-00000004 (run 'abc...')".
std::vector<std::string> other_runs_checkpoints(const fs::path& dir, const std::string& run_id) {
  std::vector<std::string> out;
  for (const auto& [step, path] : step_folders(dir)) {
    const std::optional<std::string> id = detail::checkpoint_run_id(path);
    if (id && *id != run_id)
      out.push_back(fmt::format("{} ({})", path.filename().string(),
                                id->empty()                    ? "written before run ids"
                                : *id == detail::kDamagedRunId ? "its trainer.json is damaged"
                                                               : "run '" + *id + "'"));
  }
  return out;
}

// Rank 0, before the first step: this run's complete checkpoints in dir newer than `from` (the
// step it resumes at), left when the run was resumed from an older checkpoint.
std::vector<std::string> newer_checkpoints_of_this_run(const fs::path& dir, int from,
                                                       const std::string& run_id) {
  std::vector<std::string> out;
  for (const auto& [step, path] : step_folders(dir)) {
    const std::optional<std::string> id = detail::checkpoint_run_id(path);
    if (step > from && id && *id == run_id) out.push_back(path.filename().string());
  }
  return out;
}

// Rank 0, after the checkpoint of step `saved` is complete: removes every older step folder of
// this run except the newest complete one (trainer.json written), so one good checkpoint survives
// any single damaged one; every complete checkpoint of this run newer than `saved` (the run was
// resumed from an older step: they belong to the abandoned continuation, and a later resume
// would pick them); and, with overwrite, every complete checkpoint of another run. `keep` (when
// not empty) stays. A folder that cannot be removed is reported and kept: nothing is lost.
void prune_checkpoints(const fs::path& dir, int saved, const std::string& run_id, bool overwrite,
                       const fs::path& keep) {
  bool kept = false;
  std::error_code ec;
  // Staging folders of saves that did not finish (this run holds the folder's lock: no other
  // run is writing one).
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int step = 0;
    if (std::sscanf(name.c_str(), ".step-%d.partial", &step) == 1 &&
        name == fmt::format(".{}.partial", train_checkpoint_step_dir(step))) {
      std::error_code rm;
      fs::remove_all(it->path(), rm);
    }
  }
  ec.clear();
  for (const auto& [step, path] : step_folders(dir)) {
    if (step == saved) continue;
    std::error_code same_ec;
    if (!keep.empty() && fs::equivalent(path, keep, same_ec)) continue;  // train --compare's start
    const std::optional<std::string> id = detail::checkpoint_run_id(path);
    if (id && *id != run_id) {
      if (!overwrite) continue;  // not ours to remove
    } else if (id && step > saved) {
      // this run's stale continuation: removed
    } else if (step > saved || (!kept && id)) {
      kept = kept || step < saved;
      continue;  // a newer incomplete folder (resume skips it), or the previous checkpoint
    }
    fs::remove_all(path, ec);
    if (ec)
      spdlog::warn("train: cannot remove the old checkpoint '{}': {}", path.string(), ec.message());
  }
}

}  // namespace

TrainSummary run_training(Trainer& trainer, const TrainRunOptions& options,
                          std::span<TrainObserver* const> observers) {
  const FlushDenormals flush_denormals;
  const Communicator& w = trainer.world();
  const TrainSchedule& schedule = trainer.config().train;
  // The same on every rank (the options come from the command line), so every rank throws.
  if (options.checkpoint_every < 0) {
    throw Error(
        fmt::format("train: checkpoint_every must be >= 0, got {}", options.checkpoint_every));
  }
  if (options.checkpoint_every > 0 && options.checkpoint_dir.empty())
    throw Error("train: checkpoint_every needs a checkpoint directory");

  agree_on_checkpoint_folder(w, options.checkpoint_dir, "train: the checkpoint folder");
  if (!options.resume_dir.empty()) trainer.resume(options.resume_dir);
  agree_or_throw(w, trainer.step_count() <= schedule.steps, "train",
                 fmt::format("the checkpoint is at step {}, beyond the run's {} steps",
                             trainer.step_count(), schedule.steps));
  TrainSummary summary;
  summary.first_step = trainer.step_count();
  summary.unigram_entropy = trainer.unigram_entropy();

  JsonlLog log;
  // A checkpoint folder that cannot be created fails now, not after the first steps. Rank 0 holds
  // its lock until the run ends: one run writes into a folder at a time.
  FolderLock lock;
  run_on_root(w, "train: checkpoints", [&] {
    if (options.checkpoint_dir.empty()) return;
    std::error_code ec;
    fs::create_directories(options.checkpoint_dir, ec);
    if (ec) {
      throw Error(fmt::format("cannot create the checkpoint folder '{}': {}",
                              options.checkpoint_dir.string(), ec.message()));
    }
    lock = FolderLock(options.checkpoint_dir, "train: the checkpoint folder");
    // Another run's checkpoints in the folder: refused, or replaced when asked.
    const std::vector<std::string> others =
        other_runs_checkpoints(options.checkpoint_dir, trainer.run_id());
    if (!others.empty() && !options.overwrite_checkpoints) {
      throw Error(fmt::format(
          "'{}' holds checkpoints of another run: {}; this run is '{}'. Resume that run from it, "
          "write into another folder, or replace them (--overwrite-checkpoints)",
          options.checkpoint_dir.string(), fmt::join(others, ", "), trainer.run_id()));
    }
    if (!others.empty()) {
      spdlog::warn(
          "train: '{}' holds checkpoints of another run ({}): they are removed once this run's "
          "first checkpoint is complete",
          options.checkpoint_dir.string(), fmt::join(others, ", "));
    }
    if (options.resume_dir.empty()) return;
    const std::vector<std::string> newer =
        newer_checkpoints_of_this_run(options.checkpoint_dir, summary.first_step, trainer.run_id());
    if (!newer.empty()) {
      spdlog::warn(
          "train: '{}' holds this run's checkpoints newer than step {}, the one it resumes from "
          "({}): they are removed once this run's next checkpoint is complete",
          options.checkpoint_dir.string(), summary.first_step, fmt::join(newer, ", "));
    }
  });
  run_on_root(w, "train: opening the log", [&] {
    if (!options.log_jsonl.empty())
      log.open(options.log_jsonl, options.resume_dir.empty() ? 0 : summary.first_step);
  });

  for (TrainObserver* o : observers)
    o->on_start(trainer, summary.first_step);
  const auto start = std::chrono::steady_clock::now();
  while (trainer.step_count() < schedule.steps) {
    StepRecord r = trainer.step();
    if (due(r.step, schedule.eval_every) || r.step == schedule.steps) {
      const auto t0 = std::chrono::steady_clock::now();
      r.val_loss = trainer.evaluate();
      summary.eval_seconds += seconds_since(t0);
    }
    // One small collective per step, so that a log failure on rank 0 stops every rank.
    run_on_root(w, "train: writing the log", [&] {
      if (log.is_open()) log.write(r);
    });
    summary.records.push_back(r);
    if (summary.records.size() == 1) {
      const std::vector<ShapeDecision> decisions = trainer.decisions();
      for (TrainObserver* o : observers)
        o->on_decisions(decisions);
    }
    for (TrainObserver* o : observers)
      o->on_step(r);
    if (!options.checkpoint_dir.empty() &&
        (due(r.step, options.checkpoint_every) || r.step == schedule.steps)) {
      const fs::path dir = options.checkpoint_dir / train_checkpoint_step_dir(r.step);
      trainer.save_checkpoint(dir);
      // Best effort (a folder that cannot be removed is a warning); an exception is agreed.
      run_on_root(w, "train: removing old checkpoints", [&] {
        prune_checkpoints(options.checkpoint_dir, r.step, trainer.run_id(),
                          options.overwrite_checkpoints,
                          options.keep_resumed_checkpoint ? trainer.resumed_from() : fs::path());
      });
      for (TrainObserver* o : observers)
        o->on_checkpoint(r.step, dir);
    }
  }
  if (!summary.records.empty() && summary.records.back().val_loss) {
    summary.final_val_loss = *summary.records.back().val_loss;
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    summary.final_val_loss = trainer.evaluate();
    summary.eval_seconds += seconds_since(t0);
  }
  summary.seconds = seconds_since(start);
  for (TrainObserver* o : observers)
    o->on_end(summary);
  return summary;
}

}  // namespace distmuon
