#pragma once
// What `distmuon train` shows: the console report of a run (an observer of run_training), the
// table of modes per Muon shape, the comparison of two runs and the loss curves drawn by gnuplot.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "distmuon/progress.h"
#include "distmuon/trainer.h"

namespace distmuon {

// Prints to `out` (attach it on rank 0 only):
//  - at the start: ranks, model, data (windows, unigram entropy), optimizer and schedule;
//  - after the first step: the table of modes per Muon shape (format_decisions);
//  - every log_every steps and at the last step: step, training loss, validation loss when
//    measured, tokens/s (predicted bytes per second over the interval, all ranks), step time and
//    the optimizer's time split into NS compute and communication (means over the interval);
//  - between those, a progress line (ProgressLine): on a terminal rewritten in place at most
//    every progress_seconds, into a pipe or a file a whole line every 30 s (0: none);
//  - checkpoints, and at the end the time and the final validation loss against the unigram
//    entropy.
// label (e.g. "duplicated") prefixes every line when not empty.
class ConsoleReport : public TrainObserver {
 public:
  explicit ConsoleReport(std::FILE* out = stdout, double progress_seconds = 1.0,
                         std::string label = {});

  void on_start(const Trainer& trainer, int first_step) override;
  void on_decisions(const std::vector<ShapeDecision>& decisions) override;
  void on_step(const StepRecord& record) override;
  void on_checkpoint(int step, const std::filesystem::path& dir) override;
  void on_end(const TrainSummary& summary) override;

 private:
  void print(const std::string& text);  // one line, prefixed, flushed

  std::FILE* out_;
  ProgressLine progress_;
  std::string prefix_;
  int steps_ = 0, log_every_ = 1, group_size_ = 1;
  Index batch_ = 0;
  std::chrono::steady_clock::time_point started_;
  // Sums over the current log interval.
  int interval_steps_ = 0;
  double interval_step_ms_ = 0, interval_opt_ms_ = 0, interval_comm_ms_ = 0;
};

// "blocks.*.fc1 (6)" for blocks.0.fc1 ... blocks.5.fc1; other names joined by commas.
std::string compact_names(const std::vector<std::string>& names);

// The modes per Muon shape with the cost model's estimates for both modes, one row per shape.
std::string format_decisions(const std::vector<ShapeDecision>& decisions);

// Losses per step of two runs from the same seed side by side: the largest relative difference
// of the training and validation losses, and each run's mean step and optimizer times.
std::string format_comparison(const TrainSummary& a, const std::string& a_label,
                              const TrainSummary& b, const std::string& b_label);

// One run's curves: (step, loss) for the training loss and the measured validation losses.
struct LossCurve {
  std::string label;
  std::vector<std::pair<int, double>> train, val;
};
LossCurve loss_curve(const TrainSummary& summary, std::string label);

// Throws distmuon::Error when a plot could not be written to png: gnuplot is not on PATH, the
// folder does not exist, or png is a folder, a device or another file that is not a regular one.
// Lets a command fail before training rather than after.
void check_plot_possible(const std::filesystem::path& png);
// Draws the curves (training loss as lines, validation loss as points) and a dashed line at the
// unigram entropy into png through gnuplot. Throws distmuon::Error with gnuplot's messages.
void render_loss_plot(const std::vector<LossCurve>& curves, double unigram_entropy,
                      const std::string& title, const std::filesystem::path& png);

}  // namespace distmuon
