#pragma once
// The character-level model trained data-parallel with its Muon weights row-sharded (GTP/FSDP)
// over the data-parallel group.
//
// Every rank holds:
//  - for each Muon weight (input projection, fc1, fc2): a row shard [shard_rows, cols] with its
//    RowSharding (unpadded shape, pad_length), as the optimizer registers it;
//  - for each AdamW parameter (embedding, head): the full matrix, replicated.
// A step on this rank's batch (each rank sees different windows):
//  1. all-gather every Muon weight into a full buffer (all of them at once: the model is small, so
//     there is no per-layer prefetching);
//  2. forward and backward of the full model on the local batch;
//  3. reduce-scatter each Muon gradient back to shards and all-reduce each AdamW gradient, both
//     divided by G: every rank ends with the gradient of the mean loss over the global batch.
// The optimizer then updates the local values from the local gradients; nothing else is shared.

#include <cstdint>
#include <string>
#include <vector>

#include "distmuon/charlm.h"
#include "distmuon/comm.h"
#include "distmuon/fsdp.h"

namespace distmuon {

struct ShardedParam {
  std::string name;
  ParamKind kind = ParamKind::kMuon;
  Index rows = 0, cols = 0;  // full, unpadded shape
  bool sharded = false;      // true for Muon weights: value holds a row shard
  RowSharding sharding;      // when sharded
  Matrix value;              // [shard_rows, cols] when sharded, else [rows, cols]
  Matrix grad;               // same shape as value; written by forward_backward
};

class ShardedCharLm {
 public:
  // Initialises the weights from the seed (init_charlm_weights: the same full model for every
  // group size) and keeps this rank's shards. Collective: checks that every rank of the group
  // passes the same config and seed (CollectiveError on all ranks otherwise). replicated: the
  // Muon weights are not sharded either (data parallelism: every rank holds every weight whole
  // and their gradients are all-reduced, as the other parameters' are).
  ShardedCharLm(const CharLmConfig& config, std::uint64_t seed, Communicator group,
                bool replicated = false);

  const CharLmConfig& config() const { return model_.config(); }
  const Communicator& group() const { return group_; }
  // The parameters, in charlm_param_infos() order.
  std::vector<ShardedParam>& params() { return params_; }
  const std::vector<ShardedParam>& params() const { return params_; }

  // Collective. Runs steps 1-3 on this rank's batch and returns the mean loss over the global
  // batch. Every rank's batch must hold the same number of windows (checked on all ranks).
  double forward_backward(const CharBatch& local_batch);
  // Collective. Mean loss over the windows of all ranks' batches (sizes may differ, even be 0);
  // no gradients.
  double evaluate(const CharBatch& local_batch);
  // Collective. The full weights, all-gathered (for checks and exports).
  CharLmWeights gather_weights();

 private:
  void gather_into_full();

  Communicator group_;
  CharLm model_;
  std::vector<ShardedParam> params_;
  CharLmWeights full_;   // the full weights: Muon ones gathered, AdamW ones copied from params_
  CharLmWeights grads_;  // full gradients of the local batch
  ShardingWorkspace ws_;
};

}  // namespace distmuon
