// tp_mode=auto for the optimizer: the key of a parameter, the topology probe of its groups, and
// one decision shared by every rank that holds a piece of the weight.
#include <fmt/format.h>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/topology.h"
#include "optim/muon_impl.h"

namespace distmuon {

struct AutoState {
  AutoModeResolver resolver;
  std::map<const CommImpl*, bool> crosses;  // topology probe per group
};

std::unique_ptr<AutoState, void (*)(AutoState*)> make_auto_state(const MuonOptions& o) {
  return {new AutoState{AutoModeResolver(o.profile, o.cost_model), {}},
          [](AutoState* a) { delete a; }};
}

namespace {

bool probe(AutoState& a, const Communicator& group) {
  auto it = a.crosses.find(group.impl_ptr().get());
  if (it == a.crosses.end())
    it = a.crosses.emplace(group.impl_ptr().get(), crosses_domain(group)).first;
  return it->second;
}

}  // namespace

TpMode resolve_auto_mode(Muon::Impl& s, ParamState& p) {
  DISTMUON_ASSERT(s.auto_state != nullptr, "tp_mode auto without a resolver");
  AutoState& a = *s.auto_state;
  const detail::ShardLayout& l = p.layout;
  const bool tp_on = l.tp_dim != kNoPartition && l.tp_size > 1;
  const bool gtp_on = l.gtp_size > 1;
  DISTMUON_ASSERT(tp_on || gtp_on, "auto on an unsharded parameter");
  AutoKey key{.m = l.m, .n = l.n, .steps = s.ns.steps, .use_syrk = s.ns.use_syrk, .elem_size = 4};
  const Communicator* larger = &p.gtp;    // distributes
  const Communicator* smaller = nullptr;  // two-step: all-gathered first
  if (tp_on && gtp_on) {
    const bool over_gtp = l.gtp_size >= l.tp_size;  // a tie distributes over GTP
    larger = over_gtp ? &p.gtp : &p.tp;
    smaller = over_gtp ? &p.tp : &p.gtp;
    key.group_size = larger->size();
    key.second_group_size = smaller->size();
    key.partition_dim = over_gtp ? 0 : l.tp_dim;
  } else if (gtp_on) {
    key.group_size = l.gtp_size;
    key.partition_dim = 0;
  } else {
    larger = &p.tp;
    key.group_size = l.tp_size;
    key.partition_dim = l.tp_dim;
  }
  // The weight crosses a domain when either of its groups does. In the two-step case the OR is
  // taken over every group that holds a piece of the weight, so all those ranks build one key.
  bool crosses = probe(a, *larger) || (smaller != nullptr && probe(a, *smaller));
  if (smaller != nullptr) {
    crosses = smaller->all_reduce<std::int32_t>(crosses ? 1 : 0, ReduceOp::kMax) != 0;
    crosses = larger->all_reduce<std::int32_t>(crosses ? 1 : 0, ReduceOp::kMax) != 0;
  }
  key.crosses_domain = crosses;
  TpMode mode = a.resolver.resolve(key, *larger);
  if (smaller != nullptr) {
    // Every larger group decided on its own rank 0; the smaller group's rank 0 lies in one and
    // the same larger group for all of them, so its decision becomes everybody's.
    std::int32_t m = static_cast<std::int32_t>(mode);
    smaller->broadcast(std::span<std::int32_t>(&m, 1), 0);
    mode = static_cast<TpMode>(m);
  }
  p.mode = mode;
  p.auto_key = key;
  return mode;
}

void restore_auto_decision(Muon::Impl& s, const AutoKey& key, TpMode mode) {
  if (s.auto_state != nullptr) s.auto_state->resolver.restore(key, mode);
}

std::map<AutoKey, TpMode> Muon::auto_decisions() const {
  if (impl_->auto_state == nullptr) return {};
  return impl_->auto_state->resolver.decisions();
}

}  // namespace distmuon
