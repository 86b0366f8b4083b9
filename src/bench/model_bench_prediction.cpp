// The model benchmark's predictions (model_bench_prediction.h).
#include "bench/model_bench_prediction.h"

#include <algorithm>

#include "distmuon/layout.h"

namespace distmuon::detail {

double predict_owner(std::span<const AutoKey> keys, const HardwareProfile* profile,
                     const ExchangeSchedule& schedule) {
  if (profile == nullptr || keys.empty()) return 0;
  std::vector<CostEstimate> estimates;
  estimates.reserve(keys.size());
  for (const AutoKey& k : keys)
    estimates.push_back(estimate(k, profile, CostModel::kRefined));
  return estimate_owner_bucket(keys, estimates, profile, schedule).cost();
}

int chosen_owner_chunks(std::span<const AutoKey> keys, const HardwareProfile* profile,
                        LinkModel link) {
  std::vector<CostEstimate> estimates;
  estimates.reserve(keys.size());
  for (const AutoKey& k : keys)
    estimates.push_back(estimate(k, profile, CostModel::kRefined));
  return estimate_owner_bucket(keys, estimates, profile, {kChosenChunks, link}).chunks;
}

ReplicatedPrediction predict_replicated(const std::vector<WeightShape>& weights,
                                        const NsOptions& ns, int replicas, bool crosses,
                                        const HardwareProfile* profile, CostModel model,
                                        int pipeline, LinkModel link) {
  std::vector<AutoKey> keys;
  // A key per parameter (a batched one: count / batch keys of its batch), priced as the CPU runs
  // it; the homes take its matrices one by one.
  for (const WeightShape& w : weights) {
    keys.insert(keys.end(), static_cast<std::size_t>(w.count / std::max<Index>(w.batch, 1)),
                auto_key(ShardLayout{.m = w.m, .n = w.n, .batch = w.batch}, ns,
                         NsAlgorithm::kStandard, false));
  }
  const auto at = [&](int chunks, double wire) {
    return estimate_replica_bucket(keys, replicas, crosses, profile, model, wire, {chunks, link});
  };
  const ReplicaBucketEstimate serial = at(1, 4.0), pipelined = at(pipeline, 4.0),
                              bf16 = at(pipeline, 2.0);
  ReplicatedPrediction out;
  out.auto_home = pipelined.chose_home();
  out.homes = pipelined.homes;
  out.pipelined_chunks = pipelined.chunks;
  out.bf16_chunks = bf16.chunks;
  if (profile != nullptr) {
    out.every_rank_s = serial.every_rank;
    out.home_s = serial.home_cost();
    out.home_pipelined_s = pipelined.home_cost();
    out.home_bf16_s = bf16.home_cost();
  }
  return out;
}

}  // namespace distmuon::detail
