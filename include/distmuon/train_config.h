#pragma once
// Configuration of a training run of the character-level model: model shape, data, schedule and
// the optimizer's options. The defaults are configs/train-default.json, embedded in the library
// at build time; a user's JSON file overrides any subset of its fields (a JSON merge patch).
// Unknown fields and wrong types are errors that name the field, e.g. "model.hidden".

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "distmuon/charlm.h"
#include "distmuon/matrix.h"
#include "distmuon/model_preset.h"
#include "distmuon/muon.h"
#include "distmuon/text_data.h"

namespace distmuon {

struct TrainDataConfig {
  std::string path = kDefaultTextPath;
  double val_fraction = 0.1;
  Index split_block = 512;
};

struct TrainSchedule {
  std::uint64_t seed = 1;  // weights, data split and batch sampling
  int steps = 200;
  Index batch = 256;  // windows per step over all data-parallel ranks (the global batch)
  int log_every = 10;
  int eval_every = 50;        // validation loss every N steps and at the last step
  Index eval_windows = 2048;  // validation windows per evaluation (spread over the split)
  // The compute backend the optimizer runs on (compute_backend: cpu, opaque, cuda); the model's
  // forward and backward stay on the host.
  std::string device = "cpu";
  // How the ranks hold the Muon weights: "sharded" (rows split over the ranks, GTP-sharded) or
  // "replicated" (data parallelism: every rank holds them whole, gradients all-reduced; Muon
  // orthogonalises each once, on a home rank, with the optimizer's replica_mode).
  std::string weights = "sharded";
  bool replicated() const { return weights == "replicated"; }
};

struct TrainConfig {
  CharLmConfig model;
  TrainDataConfig data;
  TrainSchedule train;
  // The optimizer's options as MuonOptions' JSON fields (lr, momentum, nesterov, weight_decay,
  // coefficients, steps, tp_mode, cost_model, profile, adamw {lr, beta1, ...}; muon.h), any
  // subset: optimizer_options() fills in the rest from MuonOptions' defaults.
  nlohmann::json optimizer = nlohmann::json::object();

  // TextDataOptions for this run (context from the model, seed from the schedule).
  TextDataOptions data_options() const;
};

// The embedded default (configs/train-default.json) as text, and parsed.
const std::string& default_train_config_text();
TrainConfig default_train_config();
// Defaults overridden by `overrides` (an object, merged as a JSON merge patch); throws
// distmuon::Error naming the first bad field.
TrainConfig parse_train_config(const nlohmann::json& overrides);
// Defaults overridden by a JSON file; errors name the file and the field.
TrainConfig load_train_config(const std::string& path);
// MuonOptions' defaults overridden by config.optimizer, validated. Throws distmuon::Error naming
// the field ("train config: field 'optimizer.adamw.beta1': ..."); unknown fields are errors.
MuonOptions optimizer_options(const TrainConfig& config);

// Bytes one of `ranks` data-parallel ranks needs to train with config, estimated up front so
// that a batch or a model too large for the machine is refused with the figure before any work
// (check_memory_fits) instead of ending in std::bad_alloc after the data is read. Counts the
// weights with their gradients and optimizer state (full copies on every rank, an upper bound
// for sharded weights), the per-window activations of the larger of this rank's training batch
// and validation windows, and the batch's token ids. A double, so absurd sizes cannot wrap.
double train_memory_bytes(const TrainConfig& config, int ranks);

// The complete configuration as JSON (every field, so a run's log can record it).
nlohmann::json to_json(const TrainConfig& config);

// The Muon weights of the character-level training model, from charlm_param_infos: input
// [H, C*E] once, fc1 [F, H] and fc2 [H, F] once per block. For the default config they are the
// plan spec "train-default" (model_preset.h: model_weights, train_default_weights).
std::vector<WeightShape> charlm_muon_weights(const CharLmConfig& config);

}  // namespace distmuon
