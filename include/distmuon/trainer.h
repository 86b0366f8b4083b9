#pragma once
// Training the character-level model data-parallel with Muon on row-sharded weights: the loop
// behind `distmuon train`.
//
// Every rank of the world holds a row shard of each Muon weight (input projection, fc1, fc2;
// GTP-sharded along dim 0 over the world, zero-padded to a multiple of the world size) and the
// full embedding and head. Step t (1-based), collective over the world:
//   1. this rank's part of the global batch of step t (TextData::train_batch: a function of
//      (seed, t, rank) only, so a resumed run sees the same windows);
//   2. ShardedCharLm::forward_backward: all-gather the weights, forward and backward,
//      reduce-scatter the Muon gradients, all-reduce the others;
//   3. Muon::step: Newton-Schulz of each Muon weight over the world with the configured tp_mode
//      (auto: decided per shape by the cost model on the first step), AdamW for the embedding and
//      the head;
//   4. every eval_every steps and at the last step: the validation loss.
// The model (steps 1, 2, 4) is host code on host matrices. The optimizer (step 3) runs on the
// backend config.train.device names: on the CPU on the model's own buffers; on a backend with its
// own memory (opaque, cuda) on mirrors of the parameters and gradients in that memory, the
// gradients uploaded before Muon::step and the updated values downloaded into the model after it.
//
// Checkpoint directory (save_checkpoint / resume):
//   trainer.json         format, version, step, world size, the run's id, the run's config, per
//                        rank the model file's size and FNV-1a 64 checksum, and those of
//                        optimizer/manifest.json (which lists the optimizer's files'): every file
//                        of the folder is bound to this checkpoint (written last, by rank 0)
//   model/rank-NNNNN.bin this rank's parameter values, float32, in charlm_param_infos order (the
//                        shards of the Muon weights with their padding rows, the full embedding
//                        and head)
//   optimizer/           Muon::save (momentum and AdamW moments, step count, auto decisions)
// A save writes everything into a staging folder beside dir (".NAME.partial"), which replaces dir
// in one atomic exchange once complete (replace_dir_atomic, file_io.h): dir keeps its earlier
// complete checkpoint until then. Every file is written atomically, and only finite weights are
// saved. A resume needs the same
// world size, model, data and seed and global batch; it restores the weights and the optimizer
// state bit for bit, so the resumed run's losses equal the uninterrupted run's exactly.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/cost_model.h"
#include "distmuon/muon.h"
#include "distmuon/sharded_charlm.h"
#include "distmuon/text_data.h"
#include "distmuon/train_config.h"

namespace distmuon {

inline constexpr const char* kTrainCheckpointFormat = "distmuon-train-checkpoint";
inline constexpr int kTrainCheckpointVersion = 1;

// What one training step measured. Times are this rank's wall clock (the report and the log
// show rank 0's).
struct StepRecord {
  int step = 0;                    // 1-based
  double loss = 0;                 // mean training loss over the global batch (nats per byte)
  std::optional<double> val_loss;  // validation loss after this step, when it was measured
  double step_ms = 0;              // forward, backward, gradient reduction and optimizer step
  double opt_ms = 0;               // Muon::step
  double opt_comm_ms = 0;          // the part of opt_ms spent in the optimizer's collectives
};

// The mode used for the Muon weights of one shape, with the cost model's estimate.
struct ShapeDecision {
  Index m = 0, n = 0;
  std::vector<std::string> names;  // the weights of this shape, in parameter order
  TpMode mode = TpMode::kDuplicated;
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
  bool sharded = false;  // false at one rank: plain NS, nothing to decide
  int replicas = 1;      // train.weights replicated: the ranks holding each weight whole
  bool home = false;     // replicated, once planned: orthogonalised on one home rank
  AutoKey key;           // what auto resolves on (the optimizer's key when it resolved one)
  CostEstimate estimate;
  bool in_seconds = false;  // estimate in seconds (with a profile) or in FLOPs (without)
};

class Trainer {
 public:
  // Collective. Reads the text (config.data.path), builds the sharded model from config.train.seed
  // and registers its weights with the optimizer (optimizer_options(config)). Errors (an unreadable
  // file, a batch not divisible by the world size, bad optimizer options) throw on every rank.
  Trainer(TrainConfig config, Communicator world);
  ~Trainer();
  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;

  // Collective. One training step (step_count() + 1); measures the validation loss when the step
  // is a multiple of eval_every or the configured last step.
  StepRecord step();
  // Collective. Validation loss over config.train.eval_windows windows of the validation split.
  double evaluate();
  // Collective. Writes the checkpoint of the current step into dir (created if needed; replaced
  // whole once the new checkpoint is complete). Throws CollectiveError on every rank, before
  // anything is written, when the ranks name different folders or a weight on any rank holds a
  // NaN or an infinity (naming the weight, the element and the rank).
  void save_checkpoint(const std::filesystem::path& dir);
  // Collective. Restores weights, optimizer state and step from dir, or, when dir holds no
  // trainer.json, from its newest step-NNNNNNNN folder that does (newer folders without one were
  // interrupted while saving and are skipped); throws CollectiveError on every rank when the
  // checkpoint is missing, corrupt or from another run (naming the field).
  void resume(const std::filesystem::path& dir);

  int step_count() const;  // steps done (resumed ones included)
  // The run's id, saved in every checkpoint: 16 random hex digits drawn (on rank 0) by a new
  // trainer, the checkpoint's after resume() (empty for a checkpoint written before run ids).
  const std::string& run_id() const;
  // The checkpoint folder the last resume() loaded (its step folder); empty before any.
  const std::filesystem::path& resumed_from() const;
  const TrainConfig& config() const;
  const Communicator& world() const;
  const TextData& data() const;
  double unigram_entropy() const;  // of the whole text, nats per byte
  ShardedCharLm& model();
  const Muon& optimizer() const;
  // The mode per distinct Muon shape with its cost estimate, in order of first appearance. The
  // modes of tp_mode auto are known after the first step.
  std::vector<ShapeDecision> decisions() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TrainSummary {
  int first_step = 0;               // the step the run started from (0, or the checkpoint's)
  std::vector<StepRecord> records;  // the steps this run made
  double final_val_loss = 0;
  double unigram_entropy = 0;
  double seconds = 0;       // wall clock of the loop, evaluations and checkpoints included
  double eval_seconds = 0;  // of which evaluating
};

// Receives the events of run_training. The CLI attaches its reports on rank 0 only.
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  // Before the first step (after a resume: first_step is the checkpoint's step).
  virtual void on_start(const Trainer& /*trainer*/, int /*first_step*/) {}
  // After the first step of this process, when the modes are known.
  virtual void on_decisions(const std::vector<ShapeDecision>& /*decisions*/) {}
  virtual void on_step(const StepRecord& /*record*/) {}
  virtual void on_checkpoint(int /*step*/, const std::filesystem::path& /*dir*/) {}
  virtual void on_end(const TrainSummary& /*summary*/) {}
};

// The folder of a run's checkpoint at step (inside TrainRunOptions::checkpoint_dir):
// "step-00000042".
std::string train_checkpoint_step_dir(int step);

struct TrainRunOptions {
  std::filesystem::path log_jsonl;  // one JSON object per step, written by rank 0
  // Empty: no checkpoints. Each checkpoint goes into its own step-NNNNNNNN folder in it; after
  // one is complete the older ones except the previous are removed, so a save interrupted by a
  // crash leaves the last complete checkpoint for --resume. A folder holding complete checkpoints
  // of another run (another run id) is refused before the first step, unless
  // overwrite_checkpoints: then they are removed once this run's first checkpoint is complete.
  // Rank 0 holds the folder's lock (FolderLock, file_io.h) while the run lasts: a folder locked
  // by another run is refused before the first step. Every rank must name the same folder.
  std::filesystem::path checkpoint_dir;
  int checkpoint_every = 0;          // > 0: every N steps; with a directory, also at the last step
  std::filesystem::path resume_dir;  // empty: start from the initial weights
  bool overwrite_checkpoints = false;
  // Leave the step folder resume_dir resolved to in place when pruning (train --compare resumes
  // from it again once this run is done, even when this run checkpoints into the same folder).
  bool keep_resumed_checkpoint = false;
};

// Collective. Resumes when asked, trains until config.train.steps, saves checkpoints and writes
// the JSONL log: {"step", "loss", "val_loss" (when measured), "opt_ms", "opt_comm_ms",
// "step_ms"} per line, flushed per line. A resumed run keeps the log's lines up to the checkpoint
// and appends after them. Throws on every rank when the log cannot be written.
TrainSummary run_training(Trainer& trainer, const TrainRunOptions& options,
                          std::span<TrainObserver* const> observers = {});

}  // namespace distmuon
