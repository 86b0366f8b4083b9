#pragma once
// The one entry point that orthogonalises a step's sharded weights, whatever their modes:
// blockwise, duplicated and distributed (each weight on its own: orthogonalize_shard,
// sharded_ns.h), owner (every owner weight together, in buckets: OwnerOrthogonalizer,
// owner_ns.h), each with the standard or the Gram Newton-Schulz algorithm. Muon::step's compute
// phase calls it once per step with every stepping Muon weight; the measuring planner's owner
// candidates run through it too.
//
// Order of the collectives (the same on every rank of a weight's groups): the weights not in
// owner mode first, one after the other in the order given, then one owner run over all owner
// weights (buckets in the order of their first weight).
//
// Equal shapes in one batched NS (run_newton_schulz_batch) on a backend that batches NS
// (Compute::batches_newton_schulz; the cpu runs each matrix's NS in turn): the weights run
// locally, of the same work (same_work: equal layouts but for the batch and the replicas), local
// mode and algorithm, together; duplicated weights over groups gathered in the order given and
// held (BufferRole::kHeldFull) until their group of the same work and algorithm has batch_capacity
// of them or its last one, then orthogonalised together and copied back (only the local NS
// moves: the collectives keep their order); owner mode's homes, each chunk's weights of the same
// work together (orthogonalize_fulls). Every matrix gets the bits of its own NS.

#include <optional>
#include <span>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/layout.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp_mode.h"
#include "ns/ns_workspaces.h"
#include "tp/owner_ns.h"

namespace distmuon::detail {

// One weight of a step: this rank's update shard (shard_rows x n_tp, compute's memory, any ld),
// orthogonalised and scaled in place.
struct ShardedWeight {
  MatrixView shard;
  const ShardLayout* layout = nullptr;
  const Communicator* tp = nullptr;   // this rank's TP group (any size when not TP-sharded)
  const Communicator* gtp = nullptr;  // this rank's GTP group
  TpMode mode = TpMode::kDuplicated;  // resolved: never auto
  NsAlgorithm algorithm = NsAlgorithm::kStandard;  // NS runs run()'s ns with this algorithm
  // Owner mode only: the weight's replicas (layout->dp_size ranks holding the same shard) when
  // its home spans them, so that one rank of them all orthogonalises it (owner_ns.h); nullptr:
  // each replica runs its own. An unsharded replicated weight with a home is in owner mode.
  const Communicator* dp = nullptr;
  // When not nullptr, run() points it at where the weight's result is: the shard, or, for an
  // unsharded weight received from another replica's home, where it arrived in the run's
  // workspaces (one copy fewer; valid until the next run with them: OwnerOrthogonalizer).
  ConstMatrixView* result = nullptr;
};

// Holds what persists across steps: owner mode's orthogonalizer (its LPT assignment per bucket
// composition). One per optimizer (or per timed candidate).
class WeightOrthogonalizer {
 public:
  // cost: owner mode's per-weight estimate for LPT; empty: ns_flops_cost of the ns of the first
  // run with an owner weight.
  // bf16_replicas: homes send their results to the other replicas in bf16 (OwnerOrthogonalizer).
  // chunks: the chunk count of each owner bucket composition (OwnerChunksFn); empty: every
  // bucket in OwnerOrthogonalizer::kDefaultPipeline chunks.
  explicit WeightOrthogonalizer(OwnerCostFn cost = {}, bool bf16_replicas = false,
                                OwnerChunksFn chunks = {})
      : cost_(std::move(cost)), bf16_replicas_(bf16_replicas), chunks_(std::move(chunks)) {}

  // Orthogonalises and scales every weight in place (see the header for the order). Collective
  // over each weight's groups; every rank of them passes its weights in the same order. NS
  // scratch and the gathered buffers come from workspaces when given (kept across steps).
  // A non-finite NS input: as orthogonalize_shard (layout.h).
  void run(std::span<const ShardedWeight> weights, const NsOptions& ns, const ScaleFn& scale,
           Compute& compute, NsWorkspaces* workspaces = nullptr);

  // Owner index (t + T g + T G d) of each owner weight of the last run, in order; -1 for one run
  // locally.
  const std::vector<int>& last_owners() const { return last_owners_; }
  // OwnerOrthogonalizer::cached_plan of the owner weights, per weight of weights (owner -1 and no
  // send view for one not in owner mode or run locally); nothing when a plan is not cached.
  std::optional<OwnerOrthogonalizer::CachedPlan> cached_plan(std::span<const ShardedWeight> weights,
                                                             Compute& compute,
                                                             NsWorkspaces& workspaces) const;

 private:
  OwnerCostFn cost_;
  bool bf16_replicas_ = false;
  OwnerChunksFn chunks_;
  std::optional<OwnerOrthogonalizer> owner_;        // from the first run with an owner weight
  std::vector<OwnerOrthogonalizer::Weight> owned_;  // the owner weights of a run
  std::vector<int> last_owners_;
};

}  // namespace distmuon::detail
