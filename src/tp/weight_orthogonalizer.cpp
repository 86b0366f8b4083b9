#include "tp/weight_orthogonalizer.h"

#include <span>
#include <vector>

#include "distmuon/error.h"
#include "tp/sharded_ns.h"

namespace distmuon::detail {
namespace {

// Whether a weight's NS runs on this rank alone, with no collective: blockwise, an unsharded
// weight, or an owner weight whose bucket spans no group (owner_ns.h runs it so).
bool runs_locally(const ShardedWeight& w) {
  const ShardLayout& l = *w.layout;
  if (w.mode == TpMode::kOwner) {
    return !l.tp_on() && l.gtp_size <= 1 && (w.dp == nullptr || !l.dp_on());
  }
  return w.mode == TpMode::kBlockwise || (!l.tp_on() && !l.gtp_on());
}

// The mode whose local NS (and scale) a locally run weight gets: blockwise scales by the block.
TpMode local_mode(const ShardedWeight& w) {
  return w.mode == TpMode::kBlockwise ? TpMode::kBlockwise : TpMode::kDuplicated;
}

// Duplicated weights gathered over their groups and held until their batch runs, on a backend
// that batches NS (Compute::batches_newton_schulz): the weights of the same work (same_work)
// and algorithm form a group; a group's held matrices are orthogonalised together once
// batch_capacity of them are held or its last one arrives, and each rank's block copied back.
// Only the local NS moves: the gathers stay in the order of the weights.
class HeldBatches {
 public:
  HeldBatches(std::span<const ShardedWeight> weights, const std::vector<bool>& held) {
    group_.assign(weights.size(), -1);
    for (std::size_t i = 0; i < weights.size(); ++i) {
      if (!held[i]) continue;
      const ShardedWeight& w = weights[i];
      std::size_t g = 0;
      for (; g < groups_.size(); ++g) {
        const ShardedWeight& f = weights[groups_[g].first];
        if (f.algorithm == w.algorithm && same_work(*f.layout, *w.layout)) break;
      }
      if (g == groups_.size()) {
        const Index rows = full_work_rows(*w.layout), cols = full_work_cols(*w.layout);
        Group n{i, batch_capacity(rows, cols), 0, 0, {}, {}};
        for (const Group& o : groups_) {  // slots apart from the groups of the same shape
          const ShardLayout& l = *weights[o.first].layout;
          if (full_work_rows(l) == rows && full_work_cols(l) == cols) n.slot0 += o.capacity;
        }
        groups_.push_back(std::move(n));
      }
      group_[i] = static_cast<int>(g);
      ++groups_[g].remaining;
    }
  }

  // Gathers weight i (in the order of the weights), and runs its group's batch when due.
  void hold(std::size_t i, std::span<const ShardedWeight> weights, const NsOptions& ns,
            const ScaleFn& scale, Compute& compute, NsWorkspaces& ws) {
    Group& g = groups_[static_cast<std::size_t>(group_[i])];
    const ShardedWeight& w = weights[i];
    const MatrixView full = gather_full(w.shard, *w.layout, *w.tp, *w.gtp, compute, ws,
                                        BufferRole::kHeldFull, g.slot0 + g.held.size());
    g.held.push_back({full, w.layout, w.algorithm});
    g.shards.push_back(w.shard);
    --g.remaining;
    if (g.held.size() < g.capacity && g.remaining > 0) return;
    orthogonalize_fulls(g.held, ns, scale, compute, ws);
    for (std::size_t k = 0; k < g.held.size(); ++k)
      copy_from_full(g.held[k].full, *g.held[k].layout, compute, g.shards[k]);
    g.held.clear();
    g.shards.clear();
  }

 private:
  struct Group {
    std::size_t first;     // its first weight
    std::size_t capacity;  // batch_capacity of its full work matrix
    std::size_t slot0;     // its buffers' first slot
    std::size_t remaining;
    std::vector<FullWork> held;
    std::vector<MatrixView> shards;  // the held weights' shards
  };
  std::vector<int> group_;  // per weight: its group, -1 for none
  std::vector<Group> groups_;
};

}  // namespace

std::optional<OwnerOrthogonalizer::CachedPlan> WeightOrthogonalizer::cached_plan(
    std::span<const ShardedWeight> weights, Compute& compute, NsWorkspaces& workspaces) const {
  OwnerOrthogonalizer::CachedPlan out{std::vector<int>(weights.size(), -1),
                                      std::vector<MatrixView>(weights.size())};
  std::vector<OwnerOrthogonalizer::Weight> owned;
  std::vector<std::size_t> index;  // per owned weight: its index in weights
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const ShardedWeight& w = weights[i];
    if (w.mode != TpMode::kOwner || runs_locally(w)) continue;
    owned.push_back({w.shard, w.layout, w.tp, w.gtp, w.algorithm, w.dp, nullptr});
    index.push_back(i);
  }
  if (owned.empty()) return out;
  if (!owner_) return std::nullopt;
  const auto cached = owner_->cached_plan(owned, compute, workspaces);
  if (!cached) return std::nullopt;
  for (std::size_t k = 0; k < owned.size(); ++k) {
    out.owners[index[k]] = cached->owners[k];
    out.send[index[k]] = cached->send[k];
  }
  return out;
}

void WeightOrthogonalizer::run(std::span<const ShardedWeight> weights, const NsOptions& ns,
                               const ScaleFn& scale, Compute& compute, NsWorkspaces* workspaces) {
  NsOptions gram = ns;  // ns with the Gram algorithm, for the weights that ask for it
  gram.algorithm = NsAlgorithm::kGram;
  auto ns_of = [&](const ShardedWeight& w) -> const NsOptions& {
    return w.algorithm == NsAlgorithm::kGram ? gram : ns;
  };
  NsWorkspaces call_workspaces;  // only when the caller keeps none
  NsWorkspaces& ws = workspaces != nullptr ? *workspaces : call_workspaces;
  owned_.clear();
  last_owners_.clear();
  std::vector<int> owner_slot;     // per owner-mode weight: its index in owned_, -1 run locally
  std::vector<std::size_t> local;  // the weights run locally, batched below
  std::vector<MatrixView> batch;
  for (const ShardedWeight& w : weights) {
    if (w.result != nullptr) *w.result = w.shard;  // owner runs may point it elsewhere
  }
  // Duplicated weights over groups, on a backend that batches NS: gathered and held, each group
  // of equal work orthogonalised together (HeldBatches).
  std::vector<bool> held(weights.size(), false);
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const ShardedWeight& w = weights[i];
    DISTMUON_ASSERT(w.layout != nullptr && w.tp != nullptr && w.gtp != nullptr, "sharded weight");
    held[i] = compute.batches_newton_schulz() && w.mode == TpMode::kDuplicated && !runs_locally(w);
  }
  HeldBatches held_batches(weights, held);
  for (std::size_t i = 0; i < weights.size();) {
    const ShardedWeight& w = weights[i];
    if (held[i]) {
      held_batches.hold(i++, weights, ns_of(w), scale, compute, ws);
      continue;
    }
    if (runs_locally(w)) {
      if (w.mode == TpMode::kOwner) owner_slot.push_back(-1);
      local.push_back(i++);
      continue;
    }
    if (w.mode == TpMode::kOwner) {
      owner_slot.push_back(static_cast<int>(owned_.size()));
      owned_.push_back({w.shard, w.layout, w.tp, w.gtp, w.algorithm, w.dp, w.result});
      ++i;
      continue;
    }
    // Duplicated or distributed over groups: the consecutive slices of one batched parameter
    // (one layout) together, in order (the same collectives as one weight after the other).
    batch.clear();
    std::size_t j = i;
    for (; j < weights.size() && weights[j].layout == w.layout && weights[j].mode == w.mode &&
           weights[j].algorithm == w.algorithm && weights[j].tp == w.tp && weights[j].gtp == w.gtp;
         ++j) {
      batch.push_back(weights[j].shard);
    }
    orthogonalize_shards(batch, *w.layout, *w.tp, *w.gtp, w.mode, ns_of(w), scale, compute, ws);
    i = j;
  }
  // The local NS (no collective, so its place in the order is free): weights of the same work
  // (same_work), local mode and algorithm as one batch (a batched parameter's slices,
  // equal-shaped weights; orthogonalize_classes_local splits it at batch_capacity).
  std::vector<bool> done(local.size(), false);
  for (std::size_t a = 0; a < local.size(); ++a) {
    if (done[a]) continue;
    const ShardedWeight& w = weights[local[a]];
    batch.clear();
    for (std::size_t b = a; b < local.size(); ++b) {
      const ShardedWeight& v = weights[local[b]];
      if (!done[b] && local_mode(v) == local_mode(w) && v.algorithm == w.algorithm &&
          same_work(*v.layout, *w.layout)) {
        batch.push_back(v.shard);
        done[b] = true;
      }
    }
    orthogonalize_shards(batch, *w.layout, *w.tp, *w.gtp, local_mode(w), ns_of(w), scale, compute,
                         ws);
  }
  if (!owned_.empty()) {
    if (!owner_) {
      owner_.emplace(cost_ ? cost_ : ns_flops_cost(ns), OwnerOrthogonalizer::kDefaultPipeline,
                     bf16_replicas_, chunks_);
    }
    owner_->run(owned_, ns, scale, compute, &ws);
  }
  for (const int slot : owner_slot)
    last_owners_.push_back(slot < 0 ? -1 : owner_->last_owners()[static_cast<std::size_t>(slot)]);
}

}  // namespace distmuon::detail
