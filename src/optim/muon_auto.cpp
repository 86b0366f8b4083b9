// tp_mode=auto for the optimizer: the key of a parameter (whether its groups cross an NVLink
// domain, from the world's topology), and one decision shared by every rank that holds a piece of
// the weight.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "distmuon/agreement.h"
#include "distmuon/auto_mode.h"
#include "distmuon/checkpoint.h"
#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/topology.h"
#include "optim/muon_impl.h"
#include "tp/owner_ns.h"

namespace distmuon {

struct AutoState {
  AutoModeResolver resolver;
  std::optional<Topology> topology;  // the world's NVLink domains, gathered at the first plan
};

std::unique_ptr<AutoState, void (*)(AutoState*)> make_auto_state(const MuonOptions& o) {
  return {new AutoState{AutoModeResolver(o.profile, o.cost_model), std::nullopt},
          [](AutoState* a) { delete a; }};
}

const HardwareProfile* auto_profile(const Muon::Impl& s) {
  if (s.auto_state == nullptr) return nullptr;
  const std::optional<HardwareProfile>& p = s.auto_state->resolver.profile();
  return p ? &*p : nullptr;
}

namespace {

// The cost model's key of an auto parameter (auto_key of its layout, crosses_domain from the
// world's topology). Local: the topology knows every rank's domain, and the groups their ranks.
AutoKey key_of(Muon::Impl& s, ParamState& p) {
  const Topology& topology = *s.auto_state->topology;
  const detail::ShardLayout& l = p.layout;
  const bool tp_on = l.tp_on(), gtp_on = l.gtp_on();
  DISTMUON_ASSERT(tp_on || gtp_on, "auto on an unsharded parameter");
  // Every piece of the weight lies on this rank's TP x GTP block; it crosses a domain when one
  // of this rank's groups does (the other ranks' groups: the world all-reduce below).
  const bool crosses = (gtp_on && topology.crosses(p.gtp)) || (tp_on && topology.crosses(p.tp));
  // A batched parameter's key holds its batch, priced as the backend runs it (batched products
  // or each matrix's NS in turn).
  return auto_key(l, s.ns, s.options.ns_algorithm, crosses, 4, s.compute->batches_newton_schulz());
}

// A bucket: the auto parameters that share their groups, as owner mode runs them together.
std::vector<std::vector<std::size_t>> buckets_of(const Muon::Impl& s,
                                                 const std::vector<std::size_t>& todo) {
  std::vector<std::vector<std::size_t>> buckets;
  std::vector<std::pair<const CommImpl*, const CommImpl*>> groups;
  for (const std::size_t i : todo) {
    const ParamState& p = s.params[i];
    const bool tp_on = p.layout.tp_dim != kNoPartition && p.layout.tp_size > 1;
    const std::pair<const CommImpl*, const CommImpl*> g{
        tp_on ? p.tp.impl_ptr().get() : nullptr,
        p.layout.gtp_size > 1 ? p.gtp.impl_ptr().get() : nullptr};
    const auto it = std::find(groups.begin(), groups.end(), g);
    if (it == groups.end()) {
      groups.push_back(g);
      buckets.push_back({i});
    } else {
      buckets[static_cast<std::size_t>(it - groups.begin())].push_back(i);
    }
  }
  return buckets;
}

// The world's topology, gathered once: a probe failing on any rank fails every rank here, before
// any group's collective.
const Topology& world_topology(Muon::Impl& s) {
  if (!s.auto_state->topology) {
    try {
      s.auto_state->topology = Topology::gather(s.world);
    } catch (const CollectiveError& e) {
      throw CollectiveError(fmt::format("tp_mode=auto: {}", e.what()), e.scope());
    }
  }
  return *s.auto_state->topology;
}

}  // namespace

void plan_replica_homes(Muon::Impl& s, std::span<const std::size_t> todo) {
  DISTMUON_ASSERT(s.auto_state != nullptr, "replica_mode auto without a resolver");
  const Topology& topology = world_topology(s);
  // Whether each parameter's replicas cross an NVLink domain, on any rank (one all-reduce).
  std::vector<std::int32_t> crosses(todo.size(), 0);
  std::string why;
  try {
    for (std::size_t j = 0; j < todo.size(); ++j)
      crosses[j] = topology.crosses(s.params[todo[j]].dp) ? 1 : 0;
  } catch (const Error& e) {
    why = e.what();
  }
  agree_or_throw(s.world, why.empty(),
                 "replica_mode=auto: the NVLink-domain crossing of the replicas", why);
  s.world.all_reduce(std::span<std::int32_t>(crosses), ReduceOp::kMax);
  // Buckets: the parameters with the same replicas (and crossing), priced together on rank 0.
  const auto homes = decide_on_root<std::vector<std::int64_t>>(
      s.world, 0, "replica_mode=auto: planning the homes", [&] {
        std::vector<std::int64_t> out(todo.size(), 0);
        std::vector<bool> done(todo.size(), false);
        const AutoModeResolver& r = s.auto_state->resolver;
        const HardwareProfile* profile = r.profile() ? &*r.profile() : nullptr;
        for (std::size_t j = 0; j < todo.size(); ++j) {
          if (done[j]) continue;
          const ParamState& first = s.params[todo[j]];
          std::vector<std::size_t> at;
          std::vector<AutoKey> keys;
          for (std::size_t q = j; q < todo.size(); ++q) {
            const ParamState& p = s.params[todo[q]];
            if (done[q] || &p.dp.impl() != &first.dp.impl() || crosses[q] != crosses[j]) continue;
            done[q] = true;
            at.push_back(q);
            keys.push_back(auto_key(p.layout, s.ns, p.algorithm, false, 4,
                                    s.compute->batches_newton_schulz()));
          }
          // Priced on the schedule the homes run: the chunks the optimizer chooses for them
          // (owner_chunks: the same estimate's cheapest count).
          const ReplicaBucketEstimate e = estimate_replica_bucket(
              keys, first.layout.dp_size, crosses[j] != 0, profile, r.cost_model(),
              s.options.replica_wire == ReplicaWire::kBf16 ? 2.0 : 4.0, {kChosenChunks, {}});
          const bool seconds = profile != nullptr;
          spdlog::info(
              "replica_mode=auto: {} weights over {} replicas{}: home {} (NS {} + exchange {}) vs "
              "every rank {} -> {}",
              keys.size(), first.layout.dp_size, crosses[j] != 0 ? " (crossing domains)" : "",
              format_cost(e.home_cost(), seconds), format_cost(e.compute, seconds),
              format_cost(seconds ? e.home_cost() - e.compute : 0.0, true),
              format_cost(e.every_rank, seconds), e.chose_home() ? "home" : "every rank");
          for (const std::size_t q : at)
            out[q] = e.chose_home() ? 1 : 0;
        }
        return out;
      });
  DISTMUON_ASSERT(homes.size() == todo.size(), "one decision per replicated parameter");
  for (std::size_t j = 0; j < todo.size(); ++j) {
    s.params[todo[j]].home = homes[j] != 0;
    s.params[todo[j]].dp_crosses = crosses[j] != 0;
  }
}

void plan_auto_modes(Muon::Impl& s) {
  DISTMUON_ASSERT(s.auto_state != nullptr, "tp_mode auto without a resolver");
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].muon && !s.params[i].mode) todo.push_back(i);
  }
  if (todo.empty()) return;
  world_topology(s);
  // Keys on every rank; a weight crosses a domain when any group holding a piece of it does, on
  // any rank (one all-reduce for all of them).
  std::vector<AutoKey> keys;
  std::vector<std::int32_t> crosses;
  std::string why;
  try {
    for (const std::size_t i : todo) {
      keys.push_back(key_of(s, s.params[i]));
      crosses.push_back(keys.back().crosses_domain ? 1 : 0);
    }
  } catch (const Error& e) {
    why = e.what();
  }
  agree_or_throw(s.world, why.empty(), "tp_mode=auto: the NVLink-domain crossing of the groups",
                 why);
  s.world.all_reduce(std::span<std::int32_t>(crosses), ReduceOp::kMax);
  std::string text;
  for (std::size_t j = 0; j < todo.size(); ++j) {
    keys[j].crosses_domain = crosses[j] != 0;
    text += describe(keys[j]) + ";";
  }
  // Every rank plans the same keys; world rank 0 plans every bucket (from the cost model, or by
  // timing the leading candidates with plan = measure) and shares one code per parameter.
  agree_on(s.world, text, "tp_mode=auto: the weights to plan",
           [&](std::string_view root, std::string_view mine) {
             return fmt::format("rank {} plans {}, rank 0 plans {}", s.world.rank(), mine, root);
           });
  if (s.options.plan == PlanMode::kMeasure) {
    plan_auto_modes_by_measuring(s, todo, keys, buckets_of(s, todo));
    return;
  }
  const auto codes = decide_on_root<std::vector<std::int64_t>>(
      s.world, 0, "tp_mode=auto: planning the modes", [&] {
        std::vector<std::int64_t> out(todo.size(), 0);
        for (const std::vector<std::size_t>& bucket : buckets_of(s, todo)) {
          std::vector<AutoKey> bucket_keys;
          std::vector<std::size_t> at;
          for (const std::size_t i : bucket) {
            at.push_back(
                static_cast<std::size_t>(std::find(todo.begin(), todo.end(), i) - todo.begin()));
            bucket_keys.push_back(keys[at.back()]);
          }
          const BucketPlan plan = s.auto_state->resolver.plan(bucket_keys);
          for (std::size_t k = 0; k < at.size(); ++k)
            out[at[k]] = to_code(plan.choices[k]);
        }
        return out;
      });
  DISTMUON_ASSERT(codes.size() == todo.size(), "one code per planned parameter");
  for (std::size_t j = 0; j < todo.size(); ++j) {
    ParamState& p = s.params[todo[j]];
    const AutoChoice choice = choice_from_code(codes[j]);
    p.mode = choice.mode;
    p.algorithm = choice.algorithm;
    p.auto_key = keys[j];
    s.auto_state->resolver.restore(keys[j], choice);
  }
}

void restore_auto_decision(Muon::Impl& s, const AutoKey& key, const AutoChoice& choice) {
  if (s.auto_state != nullptr) s.auto_state->resolver.restore(key, choice);
}

std::map<AutoKey, AutoChoice> Muon::auto_decisions() const {
  if (impl_->auto_state == nullptr) return {};
  return impl_->auto_state->resolver.decisions();
}

}  // namespace distmuon
