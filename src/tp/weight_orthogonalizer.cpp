#include "tp/weight_orthogonalizer.h"

#include "distmuon/error.h"
#include "tp/sharded_ns.h"

namespace distmuon::detail {

void WeightOrthogonalizer::run(std::span<const ShardedWeight> weights, const NsOptions& ns,
                               const ScaleFn& scale, Compute& compute, NsWorkspaces* workspaces) {
  std::optional<NsOptions> gram;  // ns with the Gram algorithm, when a weight asks for it
  owned_.clear();
  last_owners_.clear();
  for (const ShardedWeight& w : weights) {
    DISTMUON_ASSERT(w.layout != nullptr && w.tp != nullptr && w.gtp != nullptr, "sharded weight");
    if (w.mode == TpMode::kOwner) {
      owned_.push_back({w.shard, w.layout, w.tp, w.gtp, w.algorithm, w.dp});
      continue;
    }
    if (w.algorithm == NsAlgorithm::kGram && !gram) {
      gram = ns;
      gram->algorithm = NsAlgorithm::kGram;
    }
    orthogonalize_shard(w.shard, *w.layout, *w.tp, *w.gtp, w.mode,
                        w.algorithm == NsAlgorithm::kGram ? *gram : ns, scale, compute, workspaces);
  }
  if (owned_.empty()) return;
  if (!owner_) {
    owner_.emplace(cost_ ? cost_ : ns_flops_cost(ns), OwnerOrthogonalizer::kDefaultPipeline,
                   bf16_replicas_);
  }
  owner_->run(owned_, ns, scale, compute, workspaces);
  last_owners_ = owner_->last_owners();
}

}  // namespace distmuon::detail
