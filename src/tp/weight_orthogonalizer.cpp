#include "tp/weight_orthogonalizer.h"

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
  for (std::size_t i = 0; i < weights.size();) {
    const ShardedWeight& w = weights[i];
    DISTMUON_ASSERT(w.layout != nullptr && w.tp != nullptr && w.gtp != nullptr, "sharded weight");
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
  // The local NS (no collective, so its place in the order is free): weights of equal layouts,
  // local mode and algorithm as one batch (a batched parameter's slices, equal-shaped weights).
  std::vector<bool> done(local.size(), false);
  for (std::size_t a = 0; a < local.size(); ++a) {
    if (done[a]) continue;
    const ShardedWeight& w = weights[local[a]];
    batch.clear();
    for (std::size_t b = a; b < local.size(); ++b) {
      const ShardedWeight& v = weights[local[b]];
      if (!done[b] && local_mode(v) == local_mode(w) && v.algorithm == w.algorithm &&
          (v.layout == w.layout || *v.layout == *w.layout)) {
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
                     bf16_replicas_);
    }
    owner_->run(owned_, ns, scale, compute, &ws);
  }
  for (const int slot : owner_slot)
    last_owners_.push_back(slot < 0 ? -1 : owner_->last_owners()[static_cast<std::size_t>(slot)]);
}

}  // namespace distmuon::detail
