#pragma once
// The optimizer's state, shared by muon.cpp (registration, step), checkpoint.cpp (save, load)
// and muon_auto.cpp (tp_mode=auto).

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "distmuon/muon.h"
#include "optim/sharded_ns.h"

namespace distmuon {

struct ParamState {
  ParamState(ParamSpec s, Communicator tp_group, Communicator gtp_group)
      : spec(std::move(s)), tp(std::move(tp_group)), gtp(std::move(gtp_group)) {}
  ParamSpec spec;  // spec.tp_group / gtp_group are unused: see tp, gtp
  Communicator tp;
  Communicator gtp;
  detail::ShardLayout layout;
  bool muon = false;
  Matrix momentum;                  // Muon: shard-shaped
  Matrix exp_avg, exp_avg_sq;       // AdamW: shard-shaped
  std::optional<TpMode> mode;       // Muon: the mode used (auto: once resolved)
  std::optional<AutoKey> auto_key;  // auto: the key it was resolved on
  bool sharded() const { return layout.tp_dim != kNoPartition || layout.gtp_size > 1; }
};

struct AutoState;  // muon_auto.cpp
namespace detail {
struct OwnerStep;  // owner_ns.h: tp_mode owner's orthogonalizer and update buffers
}

struct Muon::Impl {
  MuonOptions options;
  NsOptions ns;
  Communicator world;
  std::vector<ParamState> params;
  std::int64_t step = 0;
  bool prepared = false;  // configuration checked across the world since the last registration
  std::shared_ptr<double> comm_seconds = std::make_shared<double>(0.0);
  std::map<const CommImpl*, Communicator> timed;  // wrappers of the caller's groups
  MuonStepStats last;
  Matrix scratch;
  std::unique_ptr<AutoState, void (*)(AutoState*)> auto_state{nullptr, nullptr};
  std::shared_ptr<detail::OwnerStep> owner;  // tp_mode owner, created on the first step

  Impl(MuonOptions o, Communicator w);
  // The rank-independent configuration: options and every parameter's global metadata.
  nlohmann::json config() const;
  // Collective over the world: the configuration is the same on every rank, else
  // CollectiveError on every rank naming the first difference.
  void prepare();
  // The mode of a Muon parameter; resolves tp_mode=auto the first time (collective over its
  // groups).
  TpMode mode_of(ParamState& p);
};

// tp_mode=auto (muon_auto.cpp). The resolver of the options' profile and cost model; throws on
// an invalid profile or model.
std::unique_ptr<AutoState, void (*)(AutoState*)> make_auto_state(const MuonOptions& options);
// Resolves p's mode over its groups and records it in p.
TpMode resolve_auto_mode(Muon::Impl& impl, ParamState& p);
// Restores a saved decision into the resolver's cache (checkpoint load).
void restore_auto_decision(Muon::Impl& impl, const AutoKey& key, TpMode mode);

void to_json(nlohmann::json& j, const AutoKey& k);
void from_json(const nlohmann::json& j, AutoKey& k);

}  // namespace distmuon
