// The chunks of each owner bucket (and bucket of replicated weights on their homes) the optimizer
// runs: the cost model's cheapest pipelined schedule (ExchangeSchedule kChosenChunks), on the keys
// tp_mode=auto and replica_mode auto priced the bucket with, so that the count auto priced is the
// count that runs (docs/data-parallel.md, "The chunk count").
#include <algorithm>

#include "distmuon/cost_model.h"
#include "optim/muon_impl.h"

namespace distmuon {

static_assert(kUnpricedChunks == detail::OwnerOrthogonalizer::kDefaultPipeline,
              "the optimizer without a profile runs the executor's fixed count");

namespace {

// A parameter's key: the one tp_mode=auto resolved it on, else auto_key of its layout (as
// replica_mode auto prices replicated weights), its groups' domain crossing as planned.
AutoKey chunk_key(const Muon::Impl& s, const ParamState& p, NsAlgorithm algorithm) {
  if (p.auto_key) return *p.auto_key;
  return auto_key(p.layout, s.ns, algorithm, false, 4, s.compute->batches_newton_schulz());
}

}  // namespace

detail::OwnerChunksFn owner_chunks(const Muon::Impl& s) {
  return [&s](std::span<const detail::OwnerItem> items, bool replicas) {
    // One key per parameter: a batched parameter's slices, consecutive, share its layout (its
    // key counts its matrices).
    std::vector<AutoKey> keys;
    bool crosses = false;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i > 0 && items[i].layout == items[i - 1].layout) continue;
      const auto p = std::find_if(s.params.begin(), s.params.end(), [&](const ParamState& q) {
        return &q.layout == items[i].layout;
      });
      DISTMUON_ASSERT(p != s.params.end(), "an owner weight of the optimizer's parameters");
      keys.push_back(chunk_key(s, *p, items[i].algorithm));
      crosses |= (replicas && !p->sharded()) ? p->dp_crosses : keys.back().crosses_domain;
    }
    const HardwareProfile* profile = auto_profile(s);
    const ExchangeSchedule chosen{kChosenChunks, {}};
    const ShardLayout& first = *items.front().layout;
    if (replicas && first.tp_dim == kNoPartition && first.gtp_size == 1) {
      // Unsharded on homes over their replicas: replica_mode auto's estimate.
      return estimate_replica_bucket(keys, first.dp_size, crosses, profile, CostModel::kRefined,
                                     s.options.replica_wire == ReplicaWire::kBf16 ? 2.0 : 4.0,
                                     chosen)
          .chunks;
    }
    // Sharded (homes over the replicas too or not): tp_mode=auto's owner estimate of the bucket
    // over its T x G ranks, a crossing of any of its groups counted for all.
    std::vector<CostEstimate> estimates;
    for (AutoKey& k : keys) {
      k.crosses_domain = crosses;
      estimates.push_back(estimate(k, profile, CostModel::kRefined));
    }
    return estimate_owner_bucket(keys, estimates, profile, chosen).chunks;
  };
}

}  // namespace distmuon
