#pragma once
// The trainer's state, shared by trainer.cpp (setup, step, decisions) and train_checkpoint.cpp
// (save, resume), and the run id of a checkpoint folder (train_checkpoint.cpp, train_run.cpp).

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distmuon/trainer.h"

namespace distmuon {

struct Trainer::Impl {
  Impl(TrainConfig c, Communicator w) : config(std::move(c)), world(std::move(w)) {}
  TrainConfig config;
  Communicator world;
  MuonOptions options;
  std::optional<HardwareProfile> profile;  // of options.profile, for the decision table
  CostModel cost_model = CostModel::kRefined;
  std::optional<TextData> data;
  std::unique_ptr<ShardedCharLm> model;  // its buffers are registered with the optimizer
  std::optional<Muon> muon;
  std::vector<ConstMatrixView> grads;  // the model's gradient buffers, in registration order
  CharBatch validation;                // this rank's part of the validation windows
  double entropy = 0;
  int step = 0;
  std::string run_id;                  // Trainer::run_id
  std::filesystem::path resumed_from;  // Trainer::resumed_from
};

namespace detail {
// The run id in step_dir's trainer.json ("" when it has none: written before run ids), or nothing
// when the folder holds no trainer.json (an incomplete save). Rank-local; an unreadable file is
// reported as the id "(unreadable trainer.json)", which matches no run.
std::optional<std::string> checkpoint_run_id(const std::filesystem::path& step_dir);
}  // namespace detail

}  // namespace distmuon
