// The optimizer step of a placed model, simulated per rank. See step_simulation.h and
// docs/cost-model.md, "Placement and step simulation".
#include "distmuon/step_simulation.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/layout.h"
#include "plan/cost_rates.h"

namespace distmuon {
namespace {

constexpr StepMode kPricedModes[] = {StepMode::kDuplicated, StepMode::kDistributed,
                                     StepMode::kOwner, StepMode::kReplicatedHome};
constexpr double kMomentumBytes = 4;  // Muon's momentum buffer is fp32

// The cost model's key of a held weight: its tp x gtp groups as the optimizer builds them (the
// larger group distributes, the smaller is gathered first; a tie: GTP).
AutoKey held_key(const HeldWeight& w, const SimulationOptions& o) {
  AutoKey k;
  k.m = w.m;
  k.n = w.n;
  k.steps = o.steps;
  k.use_syrk = o.use_syrk;
  k.elem_size = o.elem_size;
  k.algorithm = o.algorithm;
  k.crosses_domain = w.shard_crosses;
  if (w.tp > 1 && w.gtp > 1) {
    k.group_size = std::max(w.tp, w.gtp);
    k.second_group_size = std::min(w.tp, w.gtp);
    k.partition_dim = w.tp > w.gtp ? w.tp_dim : 0;
  } else if (w.tp > 1) {
    k.group_size = w.tp;
    k.partition_dim = w.tp_dim;
  } else {
    k.group_size = w.gtp;
  }
  return k;
}

struct Priced {
  const HeldWeight* w;
  AutoKey key;
  const CostEstimate* e;
};

// NS and communication seconds, summed.
struct Part {
  double ns = 0, comm = 0;
  double total() const { return ns + comm; }
};

double pipelined(double a, double b, int buckets) {
  return std::max(a, b) + std::min(a, b) / buckets;
}

NsAlgorithm algorithm_for(const CostEstimate& e, TpMode mode, NsAlgorithm allowed) {
  if (allowed != NsAlgorithm::kAuto) return allowed;
  return e.cost(mode, NsAlgorithm::kGram) < e.cost(mode) ? NsAlgorithm::kGram
                                                         : NsAlgorithm::kStandard;
}

// count weights in one mode; a batch pays the latency of its collectives once.
Part mode_part(const ModeCost& c, Index count, bool batch) {
  return {static_cast<double>(count) * (c.compute_s + c.elementwise_s),
          static_cast<double>(count) * c.bandwidth_s + (batch ? 1.0 : count) * c.latency_s};
}

// Where the NS of one held weight (one expert) runs in owner or replicated-home mode: the index of
// its home in the weight's shard group (owner) or replica group (replicated-home), and the mode
// the home runs it in.
struct Assignment {
  const HeldWeight* w = nullptr;
  Index expert = -1;  // -1: the whole batch (or not an expert)
  int home = -1;      // -1: the rank itself
  TpMode mode = TpMode::kDuplicated;
};

class Simulator {
 public:
  Simulator(const SimulationOptions& o, OptimizerSharding sharding) : o_(o), sharding_(sharding) {}

  const CostEstimate& estimate_of(const AutoKey& key) {
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(key, estimate_refined(key, &o_.profile)).first;
    return it->second;
  }

  // One class of one rank in one of the four priced modes.
  ClassStep class_step(const std::vector<Priced>& items, StepMode mode) {
    ClassStep out;
    for (const Priced& p : items)
      out.weights += static_cast<int>(p.w->count());
    switch (mode) {
      case StepMode::kDuplicated:
      case StepMode::kDistributed: {
        const TpMode tp =
            mode == StepMode::kDuplicated ? TpMode::kDuplicated : TpMode::kDistributed;
        for (const Priced& p : items) {
          // A weight no group shards runs its NS where it is, whatever the mode.
          const TpMode run =
              p.key.group_size * p.key.second_group_size > 1 ? tp : TpMode::kDuplicated;
          const Part part = mode_part(p.e->of(run, algorithm_for(*p.e, run, o_.algorithm)),
                                      p.w->count(), batch(*p.w));
          out.ns_s += part.ns;
          out.comm_s += part.comm;
        }
        out.seconds = out.ns_s + out.comm_s;
        add_parameter_gather(items, out);
        break;
      }
      case StepMode::kOwner:
        owner(items, out);
        add_parameter_gather(items, out);
        break;
      case StepMode::kReplicatedHome:
        replicated_home(items, out);
        break;
      case StepMode::kAuto:
        throw Error("step simulation: auto is not a priced mode");
    }
    return out;
  }

  // The largest working set of one NS run (a batch: all its experts) in a mode, bytes.
  double workspace(const std::vector<Priced>& items, StepMode mode) const {
    double most = 0;
    for (const Priced& p : items) {
      const double m = static_cast<double>(p.w->m), n = static_cast<double>(p.w->n);
      const double s = std::min(m, n);
      double elems = 2 * m * n + 2 * s * s;
      if (mode == StepMode::kDistributed && p.key.group_size > 1) {
        const double gram = p.key.partition_dim == 0 ? n : m;
        const double shard = m * n / p.key.group_size;
        elems = 2 * shard + 2 * gram * gram;
      }
      most = std::max(most, elems * o_.elem_size * (batch(*p.w) ? p.w->count() : 1));
    }
    return most;
  }

  // Momentum bytes of the rank under the optimizer sharding (the busiest replica for
  // layer-wise: whole weights by LPT on their elements).
  double momentum(const std::vector<Priced>& items, OptimizerSharding sharding) const {
    std::map<int, std::vector<double>> by_replicas;
    double total = 0;
    for (const Priced& p : items) {
      const double elems = static_cast<double>(p.w->shard_m) * p.w->shard_n;
      for (Index e = 0; e < p.w->count(); ++e) {
        if (sharding == OptimizerSharding::kNone || p.w->replicas == 1)
          total += elems;
        else if (sharding == OptimizerSharding::kZero1)
          total += elems / p.w->replicas;
        else
          by_replicas[p.w->replicas].push_back(elems);
      }
    }
    for (const auto& [replicas, elems] : by_replicas)
      total += busiest_load(elems, replicas);
    return total * kMomentumBytes;
  }

 private:
  bool batch(const HeldWeight& w) const { return o_.batch_experts && w.count() > 1; }

  static double busiest_load(const std::vector<double>& costs, int bins) {
    const std::vector<int> owner = lpt_assign(costs, bins);
    std::vector<double> load(static_cast<std::size_t>(bins), 0.0);
    for (std::size_t i = 0; i < costs.size(); ++i)
      load[static_cast<std::size_t>(owner[i])] += costs[i];
    return *std::max_element(load.begin(), load.end());
  }

  // The all-gather over r replicas of payload bytes: ring bytes and one latency per bucket.
  double replica_gather_s(double payload, int r, bool crosses, int buckets) const {
    const detail::Rates rates(&o_.profile, o_.wire_elem_size, crosses);
    const CollectiveFit* fit = rates.all_gather;
    const double gbps = fit != nullptr ? fit->gbps : o_.profile.bandwidth_gbps(r, crosses);
    const double alpha_us = fit != nullptr ? fit->latency_us : o_.profile.latency_us(crosses);
    return payload * (r - 1) / r / (gbps * 1e9) + buckets * (r - 1) * alpha_us * 1e-6;
  }

  // With a sharded optimizer state (ZeRO-1, layer-wise) each replica updates its part and the
  // parameters are all-gathered over the replicas after the step, whatever the mode: the modes
  // that run every weight on every replica pay it after their NS (replicated-home's all-gather
  // of the updates is that one).
  void add_parameter_gather(const std::vector<Priced>& items, ClassStep& out) const {
    if (sharding_ == OptimizerSharding::kNone) return;
    std::map<std::pair<int, bool>, double> payload;
    for (const Priced& p : items) {
      if (p.w->replicas > 1) {
        payload[{p.w->replicas, p.w->replicas_cross}] +=
            static_cast<double>(p.w->shard_m) * p.w->shard_n * p.w->count() * o_.wire_elem_size;
      }
    }
    for (const auto& [group, bytes] : payload) {
      const double gather = replica_gather_s(bytes, group.first, group.second, 1);
      out.comm_s += gather;
      out.seconds += gather;
    }
  }

  // Owner mode: each bucket of weights that share their groups (LPT homes in the shard group,
  // the all-to-alls), pipelined; a weight with a group of one runs where it is.
  void owner(const std::vector<Priced>& items, ClassStep& out) {
    std::map<std::tuple<int, int, bool>, std::vector<const Priced*>> buckets;
    for (const Priced& p : items) {
      if (p.key.group_size * p.key.second_group_size <= 1) {
        const Part part = mode_part(
            p.e->of(TpMode::kDuplicated, algorithm_for(*p.e, TpMode::kDuplicated, o_.algorithm)),
            p.w->count(), batch(*p.w));
        out.ns_s += part.ns;
        out.seconds += part.ns;
        if (record != nullptr) record->push_back({p.w, -1, -1, TpMode::kDuplicated});
        continue;
      }
      buckets[{p.key.group_size, p.key.second_group_size, p.key.crosses_domain}].push_back(&p);
    }
    for (const auto& [groups, bucket] : buckets) {
      std::vector<AutoKey> keys;
      std::vector<CostEstimate> estimates;
      for (const Priced* p : bucket) {
        for (Index e = 0; e < p->w->count(); ++e) {
          keys.push_back(p->key);
          estimates.push_back(*p->e);
        }
      }
      const OwnerBucketEstimate est =
          estimate_owner_bucket(keys, estimates, &o_.profile, {o_.buckets, o_.link});
      if (record != nullptr) {
        std::size_t i = 0;
        for (const Priced* p : bucket) {
          for (Index e = 0; e < p->w->count(); ++e)
            record->push_back({p->w, p->w->expert() ? e : -1, est.owners[i++], TpMode::kOwner});
        }
      }
      out.ns_s += est.compute;
      out.comm_s += est.comm_s;
      out.seconds += est.seconds;
    }
  }

  // Replicated-home over r replicas of weights no group shards: the executor's homes
  // (estimate_replica_bucket: LPT on the FLOPs, the homes' results in an all-to-all, chunked).
  void unsharded_homes(const std::vector<const Priced*>& group, int r, bool crosses,
                       ClassStep& out) {
    std::vector<AutoKey> keys;
    for (const Priced* p : group)
      keys.insert(keys.end(), static_cast<std::size_t>(p->w->count()), p->key);
    const ReplicaBucketEstimate est =
        estimate_replica_bucket(keys, r, crosses, &o_.profile, CostModel::kRefined,
                                o_.wire_elem_size, {o_.buckets, o_.link});
    if (record != nullptr) {
      std::size_t i = 0;
      for (const Priced* p : group) {
        for (Index e = 0; e < p->w->count(); ++e)
          record->push_back({p->w, p->w->expert() ? e : -1, est.homes[i++], TpMode::kDuplicated});
      }
    }
    out.ns_s += est.compute;
    out.comm_s += est.comm_s;
    out.seconds += est.home_cost();
  }

  // Replicated-home: per group of replicas, LPT homes on each weight's per-weight best cost;
  // the busiest home's NS (with its shard group's traffic), then the all-gather of the updated
  // shards over the replicas, pipelined.
  void replicated_home(const std::vector<Priced>& items, ClassStep& out) {
    std::map<std::pair<int, bool>, std::vector<const Priced*>> groups;
    for (const Priced& p : items)
      groups[{p.w->replicas, p.w->replicas_cross}].push_back(&p);
    for (const auto& [replicas, group] : groups) {
      const auto [r, crosses] = replicas;
      if (r > 1 && std::all_of(group.begin(), group.end(), [](const Priced* p) {
            return p->key.group_size * p->key.second_group_size == 1;
          })) {
        unsharded_homes(group, r, crosses, out);
        continue;
      }
      std::vector<Part> parts;
      double payload = 0;
      for (const Priced* p : group) {
        // A weight no group shards runs its NS where it is.
        const AutoChoice best =
            p->key.group_size * p->key.second_group_size > 1
                ? p->e->best()
                : AutoChoice{TpMode::kDuplicated,
                             algorithm_for(*p->e, TpMode::kDuplicated, o_.algorithm)};
        if (r == 1) {
          parts.push_back(
              mode_part(p->e->of(best.mode, best.algorithm), p->w->count(), batch(*p->w)));
          if (record != nullptr) record->push_back({p->w, -1, -1, best.mode});
          continue;
        }
        for (Index e = 0; e < p->w->count(); ++e) {
          parts.push_back(mode_part(p->e->of(best.mode, best.algorithm), 1, false));
          if (record != nullptr) record->push_back({p->w, p->w->expert() ? e : -1, 0, best.mode});
        }
        payload +=
            static_cast<double>(p->w->shard_m) * p->w->shard_n * p->w->count() * o_.wire_elem_size;
      }
      if (r == 1) {
        for (const Part& part : parts) {
          out.ns_s += part.ns;
          out.comm_s += part.comm;
          out.seconds += part.total();
        }
        continue;
      }
      std::vector<double> costs;
      for (const Part& part : parts)
        costs.push_back(part.total());
      const std::vector<int> home = lpt_assign(costs, r);
      if (record != nullptr) {  // the last parts.size() records are this group's, in order
        const std::size_t first = record->size() - parts.size();
        for (std::size_t i = 0; i < parts.size(); ++i)
          (*record)[first + i].home = home[i];
      }
      std::vector<Part> load(static_cast<std::size_t>(r));
      for (std::size_t i = 0; i < parts.size(); ++i) {
        load[static_cast<std::size_t>(home[i])].ns += parts[i].ns;
        load[static_cast<std::size_t>(home[i])].comm += parts[i].comm;
      }
      const Part busiest =
          *std::max_element(load.begin(), load.end(),
                            [](const Part& a, const Part& b) { return a.total() < b.total(); });
      const double gather = replica_gather_s(payload, r, crosses, o_.buckets);
      out.ns_s += busiest.ns;
      out.comm_s += busiest.comm + gather;
      out.seconds += busiest.comm + pipelined(busiest.ns, gather, o_.buckets);
    }
  }

  const SimulationOptions& o_;
  OptimizerSharding sharding_;
  std::map<AutoKey, CostEstimate> cache_;

 public:
  std::vector<Assignment>* record = nullptr;  // rank_work: where each weight's NS runs
};

// A rank's weights with their keys and estimates, dense and expert apart.
std::pair<std::vector<Priced>, std::vector<Priced>> priced(const std::vector<HeldWeight>& held,
                                                           Simulator& simulator,
                                                           const SimulationOptions& o) {
  std::vector<Priced> dense, expert;
  for (const HeldWeight& w : held) {
    const AutoKey key = held_key(w, o);
    (w.expert() ? expert : dense).push_back({&w, key, &simulator.estimate_of(key)});
  }
  return {std::move(dense), std::move(expert)};
}

void validate_options(const SimulationOptions& o) {
  if (o.elem_size != 2 && o.elem_size != 4)
    throw Error(fmt::format("step simulation: elem_size must be 2 or 4, got {}", o.elem_size));
  if (o.wire_elem_size != 2 && o.wire_elem_size != 4) {
    throw Error(
        fmt::format("step simulation: wire_elem_size must be 2 or 4, got {}", o.wire_elem_size));
  }
  if (o.steps < 1) throw Error(fmt::format("step simulation: steps must be >= 1, got {}", o.steps));
  if (!(o.link.latency_s >= 0 && o.link.latency_s < 1e9) ||
      !(o.link.bytes_per_s >= 0 && o.link.bytes_per_s < 1e18)) {
    throw Error(fmt::format(
        "step simulation: the emulated link needs a latency and a bandwidth >= 0, got {} s "
        "and {} bytes/s",
        o.link.latency_s, o.link.bytes_per_s));
  }
  if (o.buckets < 1 || o.buckets > 4096)
    throw Error(fmt::format("step simulation: buckets must be in [1, 4096], got {}", o.buckets));
  o.profile.validate();
}

}  // namespace

const char* to_string(StepMode mode) {
  switch (mode) {
    case StepMode::kDuplicated:
      return "duplicated";
    case StepMode::kDistributed:
      return "distributed";
    case StepMode::kOwner:
      return "owner";
    case StepMode::kReplicatedHome:
      return "replicated-home";
    case StepMode::kAuto:
      return "auto";
  }
  return "?";
}

const ModeStep& StepSimulation::of(StepMode mode) const {
  for (const ModeStep& m : modes)
    if (m.mode == mode) return m;
  throw Error(fmt::format("step simulation: no mode {}", to_string(mode)));
}

StepSimulation simulate_step(const Placement& placement, const SimulationOptions& options) {
  validate_options(options);
  StepSimulation sim;
  sim.parallelism = placement.parallelism();
  sim.domain_size = placement.domain_size();
  sim.options = options;
  for (const LayeredWeight& w : placement.weights()) {
    sim.parameters += static_cast<double>(w.m) * w.n * w.layers *
                      static_cast<double>(std::max<Index>(w.experts_per_layer, 1));
    sim.has_experts = sim.has_experts || w.expert();
  }
  Simulator simulator(sim.options, sim.parallelism.sharding);
  const int world = placement.world();
  for (const StepMode mode : kStepModes)
    sim.modes.push_back(ModeStep{mode, std::vector<RankStep>(static_cast<std::size_t>(world))});
  // Ranks that hold the same weights in the same groups cost the same: priced once.
  std::map<std::string, std::size_t> seen;
  for (int rank = 0; rank < world; ++rank) {
    const std::vector<HeldWeight> held = placement.rank_weights(rank);
    std::string signature;
    for (const HeldWeight& w : held) {
      signature += fmt::format("{}/{}/{}/{}/{}/{}/{}/{}|", w.name, w.layer, w.experts,
                               w.shard_crosses, w.replicas_cross, w.tp, w.gtp, w.replicas);
    }
    const auto [it, fresh] = seen.emplace(signature, static_cast<std::size_t>(rank));
    if (!fresh) {
      for (ModeStep& m : sim.modes) {
        m.ranks[static_cast<std::size_t>(rank)] = m.ranks[it->second];
        m.ranks[static_cast<std::size_t>(rank)].rank = rank;
      }
      continue;
    }
    auto [dense, expert] = priced(held, simulator, sim.options);
    sim.momentum_bytes =
        std::max(sim.momentum_bytes, simulator.momentum(dense, sim.parallelism.sharding) +
                                         simulator.momentum(expert, sim.parallelism.sharding));
    for (std::size_t i = 0; i < std::size(kPricedModes); ++i) {
      ModeStep& m = sim.modes[i];
      RankStep& r = m.ranks[static_cast<std::size_t>(rank)];
      r.rank = rank;
      r.dense = simulator.class_step(dense, m.mode);
      r.expert = simulator.class_step(expert, m.mode);
      m.workspace_bytes = std::max({m.workspace_bytes, simulator.workspace(dense, m.mode),
                                    simulator.workspace(expert, m.mode)});
    }
  }
  // Auto: per class, the mode whose busiest rank is fastest (ties: the earlier mode).
  const auto busiest_class = [&](const ModeStep& m, bool expert) {
    double most = 0;
    for (const RankStep& r : m.ranks)
      most = std::max(most, expert ? r.expert.seconds : r.dense.seconds);
    return most;
  };
  ModeStep& automatic = sim.modes.back();
  std::size_t dense_best = 0, expert_best = 0;
  for (std::size_t i = 1; i < std::size(kPricedModes); ++i) {
    if (busiest_class(sim.modes[i], false) < busiest_class(sim.modes[dense_best], false))
      dense_best = i;
    if (busiest_class(sim.modes[i], true) < busiest_class(sim.modes[expert_best], true))
      expert_best = i;
  }
  automatic.dense_choice = kPricedModes[dense_best];
  automatic.expert_choice = kPricedModes[expert_best];
  automatic.workspace_bytes =
      std::max(sim.modes[dense_best].workspace_bytes, sim.modes[expert_best].workspace_bytes);
  for (int rank = 0; rank < world; ++rank) {
    const auto r = static_cast<std::size_t>(rank);
    automatic.ranks[r] = {rank, sim.modes[dense_best].ranks[r].dense,
                          sim.modes[expert_best].ranks[r].expert};
  }
  for (ModeStep& m : sim.modes) {
    for (const RankStep& r : m.ranks)
      if (r.seconds() > m.ranks[static_cast<std::size_t>(m.busiest)].seconds()) m.busiest = r.rank;
  }
  return sim;
}

std::vector<RankWork> rank_work(const Placement& placement, const SimulationOptions& options,
                                int rank, StepMode mode) {
  validate_options(options);
  if (mode == StepMode::kAuto)
    throw Error("step simulation: auto chooses per class; ask for the mode it chose");
  const std::vector<HeldWeight> held = placement.rank_weights(rank);
  Simulator simulator(options, placement.parallelism().sharding);
  const auto [dense, expert] = priced(held, simulator, options);
  std::vector<RankWork> out;
  const auto entry = [](const HeldWeight& w, Index e, NsWork work, int home) {
    return RankWork{w.name, w.layer, e < 0 ? -1 : w.first_expert + e, e < 0 ? w.experts : 1,
                    work,   home};
  };
  for (const std::vector<Priced>* items : {&dense, &expert}) {
    if (mode == StepMode::kDuplicated || mode == StepMode::kDistributed) {
      for (const Priced& p : *items) {
        const bool shard =
            mode == StepMode::kDistributed && p.key.group_size * p.key.second_group_size > 1;
        out.push_back(entry(*p.w, -1, shard ? NsWork::kShard : NsWork::kWhole, -1));
      }
      continue;
    }
    std::vector<Assignment> record;
    simulator.record = &record;
    simulator.class_step(*items, mode);
    simulator.record = nullptr;
    for (const Assignment& a : record) {
      const HeldWeight& w = *a.w;
      const NsWork here = a.mode == TpMode::kDistributed ? NsWork::kShard : NsWork::kWhole;
      if (a.home < 0) {
        out.push_back(entry(w, a.expert, here, -1));
        continue;
      }
      const std::vector<int> group = mode == StepMode::kOwner
                                         ? placement.shard_group(rank, w.expert(), w.tp == 1)
                                         : placement.replica_group(rank, w.expert(), w.tp == 1);
      const int home = group.at(static_cast<std::size_t>(a.home));
      out.push_back(
          entry(w, a.expert, home == rank ? here : NsWork::kElsewhere, home == rank ? -1 : home));
    }
  }
  return out;
}

}  // namespace distmuon
