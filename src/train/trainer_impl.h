#pragma once
// The trainer's state, shared by trainer.cpp (setup, step, decisions) and train_checkpoint.cpp
// (save, resume).

#include <memory>
#include <optional>
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
};

}  // namespace distmuon
