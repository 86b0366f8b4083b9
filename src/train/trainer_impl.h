#pragma once
// The trainer's state, shared by trainer.cpp (setup, step, decisions) and train_checkpoint.cpp
// (save, resume), and the run id of a checkpoint folder (train_checkpoint.cpp, train_run.cpp).

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distmuon/compute.h"
#include "distmuon/trainer.h"

namespace distmuon {

struct Trainer::Impl {
  Impl(TrainConfig c, Communicator w) : config(std::move(c)), world(std::move(w)) {}
  TrainConfig config;
  Communicator world;
  MuonOptions options;
  double step_timeout = 0;  // the step deadline (options.step_timeout_s, DISTMUON_STEP_TIMEOUT)
  std::optional<HardwareProfile> profile;  // of options.profile, for the decision table
  CostModel cost_model = CostModel::kRefined;
  std::optional<TextData> data;
  std::unique_ptr<ShardedCharLm> model;  // its buffers are registered with the optimizer
  // The optimizer's backend (config.train.device). On a backend with its own memory the
  // optimizer works on mirrors of the parameters and their gradients in that memory: each step
  // uploads the gradients and downloads the updated values into the model, which stays on the
  // host. On the CPU the optimizer works on the model's own buffers (no mirrors).
  Compute* compute = nullptr;
  std::vector<DeviceMatrix> values;  // mirrors of the model's parameters (empty on the CPU)
  std::vector<DeviceMatrix> grads_on_device;  // mirrors of their gradients (empty on the CPU)
  std::optional<Muon> muon;
  std::vector<ConstMatrixView> grads;  // the gradients Muon reads, in registration order

  bool mirrored() const { return !values.empty(); }
  // With mirrors: the model's values into the mirrors, the mirrors into the model's values, the
  // model's gradients into their mirrors (no-ops on the CPU).
  void upload_values();
  void download_values();
  void upload_grads();
  CharBatch validation;  // this rank's part of the validation windows
  double entropy = 0;
  int step = 0;
  std::string run_id;                  // Trainer::run_id
  std::filesystem::path resumed_from;  // Trainer::resumed_from
};

namespace detail {
// The run id of a damaged trainer.json (not JSON, not an object, a run_id that is not a string):
// it matches no run; resume reports the file as damaged.
inline constexpr const char* kDamagedRunId = "(damaged trainer.json)";
// The run id in step_dir's trainer.json ("" when it has none: written before run ids), or nothing
// when the folder holds no trainer.json (an incomplete save). Rank-local; a damaged file is
// reported as kDamagedRunId.
std::optional<std::string> checkpoint_run_id(const std::filesystem::path& step_dir);
}  // namespace detail

}  // namespace distmuon
