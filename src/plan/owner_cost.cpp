// Owner mode in the cost model: LPT over a bucket's weights, the busiest owner and the
// all-to-alls; and auto's choice for a bucket (owner against the per-weight best). Equations:
// docs/cost-model.md.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "plan/cost_rates.h"

namespace distmuon {
namespace {

bool same_groups(const AutoKey& a, const AutoKey& b) {
  return a.group_size == b.group_size && a.second_group_size == b.second_group_size &&
         a.crosses_domain == b.crosses_domain && a.elem_size == b.elem_size;
}

// The cheaper algorithm the key allows for the full matrix's NS on its owner.
NsAlgorithm owner_algorithm(const AutoKey& key, const CostEstimate& e) {
  if (key.algorithm != NsAlgorithm::kAuto) return key.algorithm;
  return e.cost(TpMode::kOwner, NsAlgorithm::kGram) < e.cost(TpMode::kOwner)
             ? NsAlgorithm::kGram
             : NsAlgorithm::kStandard;
}

// One all-to-all in which rank r receives recv[r] and sends send[r] bytes: the busiest rank's
// bytes at the bandwidth, and ranks - 1 latency steps (a pairwise exchange).
double all_to_all_s(const std::vector<double>& send, const std::vector<double>& recv, int ranks,
                    bool crosses, const detail::Rates& rates) {
  if (rates.profile == nullptr || ranks <= 1) return 0;
  double busiest = 0;
  for (std::size_t r = 0; r < send.size(); ++r)
    busiest = std::max({busiest, send[r], recv[r]});
  const CollectiveFit* fit = rates.all_gather;
  const double gbps = fit != nullptr ? fit->gbps : rates.profile->bandwidth_gbps(ranks, crosses);
  const double alpha_us = fit != nullptr ? fit->latency_us : rates.profile->latency_us(crosses);
  return busiest / (gbps * 1e9) + (ranks - 1) * alpha_us * 1e-6;
}

}  // namespace

OwnerBucketEstimate estimate_owner_bucket(std::span<const AutoKey> keys,
                                          std::span<const CostEstimate> estimates,
                                          const HardwareProfile* profile) {
  if (keys.empty() || keys.size() != estimates.size()) {
    throw Error(fmt::format("owner bucket estimate: {} keys and {} estimates", keys.size(),
                            estimates.size()));
  }
  const AutoKey& first = keys.front();
  const int ranks = first.group_size * first.second_group_size;
  const auto n = keys.size();
  OwnerBucketEstimate out;
  std::vector<double> flops(n), cost(n), bytes(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!same_groups(keys[i], first)) {
      throw Error(
          fmt::format("owner bucket estimate: weight {} ({}) and weight 0 ({}) do not share "
                      "their groups",
                      i, describe(keys[i]), describe(first)));
    }
    if (!estimates[i].prices_gram)
      throw Error("owner bucket estimate: owner mode is priced by the refined model only");
    const NsAlgorithm a = owner_algorithm(keys[i], estimates[i]);
    out.algorithms.push_back(a);
    flops[i] = estimates[i].of(TpMode::kOwner, a).flops;
    cost[i] = estimates[i].cost(TpMode::kOwner, a);
    bytes[i] = estimates[i].of(TpMode::kOwner, a).payload_bytes / 2;  // one direction
    out.payload_bytes += 2 * bytes[i];
  }
  // The executor assigns on FLOPs (it has no profile); the estimate follows the same assignment.
  out.owners = lpt_assign(flops, ranks);
  const auto r_count = static_cast<std::size_t>(ranks);
  std::vector<double> load(r_count, 0.0), recv(r_count, 0.0), send(r_count, 0.0);
  const double g = ranks;
  for (std::size_t i = 0; i < n; ++i) {
    const auto o = static_cast<std::size_t>(out.owners[i]);
    load[o] += cost[i];
    // Gather: every other rank sends the owner its 1/g of the matrix.
    recv[o] += bytes[i] * (g - 1) / g;
    for (std::size_t r = 0; r < r_count; ++r)
      if (r != o) send[r] += bytes[i] / g;
  }
  out.compute = *std::max_element(load.begin(), load.end());
  // Gather and scatter move the same bytes in opposite directions.
  const detail::Rates rates(profile, first.elem_size, first.crosses_domain);
  out.comm_s = 2 * all_to_all_s(send, recv, ranks, first.crosses_domain, rates);
  return out;
}

ReplicaBucketEstimate estimate_replica_bucket(std::span<const AutoKey> keys, int replicas,
                                              bool crosses, const HardwareProfile* profile,
                                              CostModel model, double wire_bytes) {
  if (replicas < 1 || replicas > kMaxGroupSize) {
    throw Error(fmt::format("replica bucket estimate: {} replicas (valid: 1 to {})", replicas,
                            kMaxGroupSize));
  }
  if (!(wire_bytes > 0 && wire_bytes <= 8)) {
    throw Error(
        fmt::format("replica bucket estimate: {} bytes per element on the wire (valid: "
                    "more than 0, at most 8)",
                    wire_bytes));
  }
  ReplicaBucketEstimate out;
  const auto n = keys.size();
  std::vector<double> flops(n), cost(n), bytes(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (keys[i].group_size != 1 || keys[i].second_group_size != 1) {
      throw Error(
          fmt::format("replica bucket estimate: weight {} ({}) is sharded", i, describe(keys[i])));
    }
    const CostEstimate e = estimate(keys[i], profile, model);
    const NsAlgorithm a = e.prices_gram ? owner_algorithm(keys[i], e) : NsAlgorithm::kStandard;
    out.algorithms.push_back(a);
    flops[i] = e.of(TpMode::kDuplicated, a).flops;
    cost[i] = e.cost(TpMode::kDuplicated, a);
    bytes[i] = wire_bytes * static_cast<double>(keys[i].m) * static_cast<double>(keys[i].n);
    out.every_rank += cost[i];
  }
  out.homes = lpt_assign(flops, replicas);
  const auto r_count = static_cast<std::size_t>(replicas);
  std::vector<double> load(r_count, 0.0), send(r_count, 0.0), recv(r_count, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto h = static_cast<std::size_t>(out.homes[i]);
    load[h] += cost[i];
    send[h] += bytes[i] * (replicas - 1);  // to every other replica
    for (std::size_t r = 0; r < r_count; ++r)
      if (r != h) recv[r] += bytes[i];
  }
  out.compute = n == 0 ? 0.0 : *std::max_element(load.begin(), load.end());
  out.payload_bytes = n == 0 ? 0.0 : *std::max_element(send.begin(), send.end());
  const int elem_size = n == 0 ? 4 : keys.front().elem_size;
  const detail::Rates rates(profile, elem_size, crosses);
  out.comm_s = all_to_all_s(send, recv, replicas, crosses, rates);
  return out;
}

BucketPlan plan_bucket(std::span<const AutoKey> keys, const HardwareProfile* profile,
                       CostModel model) {
  BucketPlan plan;
  if (keys.empty()) return plan;
  std::vector<CostEstimate> estimates;
  estimates.reserve(keys.size());
  for (const AutoKey& k : keys) {
    estimates.push_back(estimate(k, profile, model));
    plan.choices.push_back(estimates.back().best());
    plan.per_weight_cost += estimates.back().best_cost();
  }
  const AutoKey& first = keys.front();
  if (model != CostModel::kRefined || first.group_size * first.second_group_size < 2) return plan;
  plan.owner = estimate_owner_bucket(keys, estimates, profile);
  if (plan.owner->cost() < plan.per_weight_cost) {
    for (std::size_t i = 0; i < keys.size(); ++i)
      plan.choices[i] = {TpMode::kOwner, plan.owner->algorithms[i]};
  }
  return plan;
}

}  // namespace distmuon
