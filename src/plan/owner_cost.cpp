// Owner mode in the cost model: LPT over a bucket's weights, the busiest owner and the
// all-to-alls; and auto's choice for a bucket (owner against the per-weight best). Equations:
// docs/cost-model.md.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "plan/cost_rates.h"
#include "plan/exchange_schedule.h"
#include "tp/owner_ns.h"

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

// The executor's chunks (orthogonalize_owned): its LPT order of the weights on their FLOPs
// (the costs it assigns on) cut where it cuts them (detail::chunk_starts).
std::vector<std::vector<std::size_t>> chunk_weights(std::span<const double> flops, int homes,
                                                    int chunks) {
  const detail::OwnerPlan plan = detail::plan_owners(flops, homes);
  const std::vector<std::size_t> starts = detail::chunk_starts(plan, std::max(chunks, 1));
  std::vector<std::vector<std::size_t>> out(starts.size() - 1);
  for (std::size_t j = 0; j + 1 < starts.size(); ++j)
    out[j].assign(plan.order.begin() + static_cast<std::ptrdiff_t>(starts[j]),
                  plan.order.begin() + static_cast<std::ptrdiff_t>(starts[j + 1]));
  return out;
}

// Per-rank terms of one exchange: the emulated link's minimum and the staging copies.
struct ExchangeTerms {
  const detail::Rates& rates;
  const LinkModel& link;
  // An exchange in which every rank r sends sent[r] bytes (all its blocks, as the link counts
  // them) and copies pack[r] elements into its staging and unpack[r] out of it.
  detail::ExchangeTimes make(const std::vector<double>& sent, const std::vector<double>& pack,
                             const std::vector<double>& unpack, double transfer_s) const {
    detail::ExchangeTimes x;
    x.transfer_s = transfer_s;
    for (std::size_t r = 0; r < sent.size(); ++r) {
      x.link_s.push_back(link_s(sent[r]));
      x.pack_s.push_back(copy_s(pack[r]));
      x.unpack_s.push_back(copy_s(unpack[r]));
    }
    return x;
  }
  double link_s(double bytes) const {
    if (link.latency_s <= 0 && link.bytes_per_s <= 0) return 0;
    return link.latency_s + (link.bytes_per_s > 0 ? bytes / link.bytes_per_s : 0.0);
  }
  // Elements copied at the calibrated copy rate (the elementwise "scale" pass: one read-write
  // stream); nothing without a calibration of the precision.
  double copy_s(double elements) const {
    return rates.compute == nullptr ? 0.0 : elements / (rates.compute->elementwise.scale * 1e9);
  }
};

// The bucket on the schedule's chunks: `requested` (capped at the matrices, as the executor
// cuts them), or with kChosenChunks the cheapest candidate (detail::cheapest_chunks), the
// count the optimizer runs. price(c): {seconds, the chunks run} on c chunks.
template <typename Price>
detail::ChunkChoice on_schedule(int requested, std::size_t matrices, const Price& price) {
  if (requested == kChosenChunks)
    return detail::cheapest_chunks(matrices, [&](int c) { return price(c).first; });
  const auto [seconds, chunks] = price(detail::unpriced_chunks(requested, matrices));
  return {static_cast<int>(chunks), seconds};
}

}  // namespace

OwnerBucketEstimate estimate_owner_bucket(std::span<const AutoKey> keys,
                                          std::span<const CostEstimate> estimates,
                                          const HardwareProfile* profile,
                                          const ExchangeSchedule& schedule) {
  if (keys.empty() || keys.size() != estimates.size()) {
    throw Error(fmt::format("owner bucket estimate: {} keys and {} estimates", keys.size(),
                            estimates.size()));
  }
  const AutoKey& first = keys.front();
  const int ranks = first.group_size * first.second_group_size;
  OwnerBucketEstimate out;
  // One unit per matrix (a batched key's matrices in turn, each a batch-th of its share): the
  // executor assigns and chunks the matrices of a batched parameter one by one.
  std::vector<double> flops, cost, bytes;
  for (std::size_t i = 0; i < keys.size(); ++i) {
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
    const double b = static_cast<double>(keys[i].batch);
    const ModeCost& c = estimates[i].of(TpMode::kOwner, a);
    flops.insert(flops.end(), static_cast<std::size_t>(keys[i].batch), c.flops / b);
    cost.insert(cost.end(), static_cast<std::size_t>(keys[i].batch),
                estimates[i].cost(TpMode::kOwner, a) / b);
    bytes.insert(bytes.end(), static_cast<std::size_t>(keys[i].batch),
                 c.payload_bytes / 2 / b);  // one direction
    out.payload_bytes += c.payload_bytes;
  }
  const auto n = flops.size();
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
  out.chunks = detail::unpriced_chunks(schedule.chunks, n);
  if (profile == nullptr) return out;
  // The schedule: per chunk, the gather (every rank sends the owner row its shard of each
  // weight, its own included, and the owner copies the full matrix out of its staging), the
  // owners' NS, and the scatter (the reverse). A bucket split over two groups at once chains its
  // two stages per chunk; it is priced as one exchange each way over all its ranks.
  const detail::Rates rates(profile, first.elem_size, first.crosses_domain);
  const ExchangeTerms terms{rates, schedule.link};
  const auto price = [&](int chunks) {
    std::vector<detail::ChunkTimes> times;
    for (const std::vector<std::size_t>& ids : chunk_weights(flops, ranks, chunks)) {
      std::vector<double> ns(r_count, 0.0), c_send(r_count, 0.0), c_recv(r_count, 0.0);
      std::vector<double> shards(r_count, 0.0), owned(r_count, 0.0);
      std::vector<double> shard_elems(r_count, 0.0), owned_elems(r_count, 0.0);
      for (const std::size_t i : ids) {
        const auto o = static_cast<std::size_t>(out.owners[i]);
        const double elems = bytes[i] / first.elem_size;
        ns[o] += cost[i];
        owned[o] += bytes[i];
        owned_elems[o] += elems;
        c_recv[o] += bytes[i] * (g - 1) / g;
        for (std::size_t r = 0; r < r_count; ++r) {
          shards[r] += bytes[i] / g;
          shard_elems[r] += elems / g;
          if (r != o) c_send[r] += bytes[i] / g;
        }
      }
      const double transfer = all_to_all_s(c_send, c_recv, ranks, first.crosses_domain, rates);
      times.push_back({terms.make(shards, shard_elems, owned_elems, transfer), std::move(ns),
                       terms.make(owned, owned_elems, shard_elems, transfer)});
    }
    return std::pair{detail::schedule_seconds(times, true), times.size()};
  };
  out.comm_s = price(1).first - out.compute;
  const detail::ChunkChoice run = on_schedule(schedule.chunks, n, price);
  out.seconds = run.seconds;
  out.chunks = run.chunks;
  return out;
}

ReplicaBucketEstimate estimate_replica_bucket(std::span<const AutoKey> keys, int replicas,
                                              bool crosses, const HardwareProfile* profile,
                                              CostModel model, double wire_bytes,
                                              const ExchangeSchedule& schedule) {
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
  // One unit per matrix (a batched key's matrices in turn, each a batch-th of the batch's NS):
  // the homes are assigned and chunked matrix by matrix, as the executor does; every rank runs
  // the whole batch (as one batch).
  std::vector<double> flops, cost, bytes, elements;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].group_size != 1 || keys[i].second_group_size != 1) {
      throw Error(
          fmt::format("replica bucket estimate: weight {} ({}) is sharded", i, describe(keys[i])));
    }
    const CostEstimate e = estimate(keys[i], profile, model);
    const NsAlgorithm a = e.prices_gram ? owner_algorithm(keys[i], e) : NsAlgorithm::kStandard;
    out.algorithms.push_back(a);
    const auto b = static_cast<std::size_t>(keys[i].batch);
    const double elems = static_cast<double>(keys[i].m) * static_cast<double>(keys[i].n);
    flops.insert(flops.end(), b, e.of(TpMode::kDuplicated, a).flops / static_cast<double>(b));
    cost.insert(cost.end(), b, e.cost(TpMode::kDuplicated, a) / static_cast<double>(b));
    bytes.insert(bytes.end(), b, wire_bytes * elems);
    elements.insert(elements.end(), b, elems);
    out.every_rank += e.cost(TpMode::kDuplicated, a);
  }
  const auto n = flops.size();
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
  out.chunks = detail::unpriced_chunks(schedule.chunks, n);
  if (profile == nullptr || n == 0 || replicas == 1) return out;
  // The schedule: per chunk, the homes' NS (a bf16 wire: and the rounding of their results),
  // then the exchange: each home copies its results into its staging once per other replica
  // (a bf16 wire: and packs them), every replica copies what it receives out of its staging
  // (a bf16 wire: after unpacking it).
  const detail::Rates rates(profile, keys.front().elem_size, crosses);
  const ExchangeTerms terms{rates, schedule.link};
  const bool bf16 = wire_bytes < 4;
  const double passes = bf16 ? 2 : 1;
  const auto price = [&](int chunks) {
    std::vector<detail::ChunkTimes> times;
    for (const std::vector<std::size_t>& ids : chunk_weights(flops, replicas, chunks)) {
      std::vector<double> ns(r_count, 0.0), c_send(r_count, 0.0), c_recv(r_count, 0.0);
      std::vector<double> pack(r_count, 0.0), unpack(r_count, 0.0);
      for (const std::size_t i : ids) {
        const auto h = static_cast<std::size_t>(out.homes[i]);
        const double elems = elements[i];
        ns[h] += cost[i] + (bf16 ? terms.copy_s(elems) : 0.0);
        c_send[h] += bytes[i] * (replicas - 1);
        pack[h] += passes * elems * (replicas - 1);
        for (std::size_t r = 0; r < r_count; ++r) {
          if (r == h) continue;
          c_recv[r] += bytes[i];
          unpack[r] += passes * elems;
        }
      }
      const double transfer = all_to_all_s(c_send, c_recv, replicas, crosses, rates);
      times.push_back({{}, std::move(ns), terms.make(c_send, pack, unpack, transfer)});
    }
    return std::pair{detail::schedule_seconds(times, false), times.size()};
  };
  out.comm_s = price(1).first - out.compute;
  const detail::ChunkChoice run = on_schedule(schedule.chunks, n, price);
  out.seconds = run.seconds;
  out.chunks = run.chunks;
  return out;
}

BucketPlan plan_bucket(std::span<const AutoKey> keys, const HardwareProfile* profile,
                       CostModel model) {
  return plan_bucket(keys, profile, model, {kChosenChunks, {}});
}

BucketPlan plan_bucket(std::span<const AutoKey> keys, const HardwareProfile* profile,
                       CostModel model, const ExchangeSchedule& schedule) {
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
  plan.owner = estimate_owner_bucket(keys, estimates, profile, schedule);
  if (plan.owner->cost() < plan.per_weight_cost) {
    for (std::size_t i = 0; i < keys.size(); ++i)
      plan.choices[i] = {TpMode::kOwner, plan.owner->algorithms[i]};
  }
  return plan;
}

}  // namespace distmuon
