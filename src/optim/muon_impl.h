#pragma once
// The optimizer's state, shared by muon.cpp (registration, step), checkpoint.cpp (save, load)
// and muon_auto.cpp (tp_mode=auto).

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "distmuon/hardware_profile.h"
#include "distmuon/layout.h"
#include "distmuon/muon.h"
#include "ns/ns_workspaces.h"
#include "tp/sharded_ns.h"
#include "tp/weight_orthogonalizer.h"

namespace distmuon {

struct ParamState {
  ParamState(ParamSpec s, Communicator tp_group, Communicator gtp_group, Communicator dp_group)
      : spec(std::move(s)),
        tp(std::move(tp_group)),
        gtp(std::move(gtp_group)),
        dp(std::move(dp_group)) {}
  ParamSpec spec;   // as registered, without its groups (add_parameter moves them to tp, gtp)
  Communicator tp;  // spec's TP group (a group of one when not TP-split), timed
  Communicator gtp;
  Communicator dp;  // spec's replicas (a group of one when not replicated), timed
  detail::ShardLayout layout;
  bool muon = false;
  DeviceMatrix weight32;  // a bfloat16 weight (spec.bf16): its float32 copy during a step
  DeviceMatrix momentum;  // Muon: shard-shaped, compute's memory (with momentum16: a step's copy)
  // Muon, MomentumDtype kParam on a bfloat16 weight: the momentum in bf16, two to a float.
  DeviceMatrix momentum16;
  DeviceMatrix update;  // Muon: this step's update, from the compute phase to the apply phase
  // Muon: where the compute phase left this step's update: update, or, for an unsharded weight
  // received from another replica's home, where it arrived (ShardedWeight::result).
  ConstMatrixView result;
  // Muon, this step (Muon::Impl::plan_homes): its NS input is not stored (sums_only), or is
  // stored in the replicas' send staging (staged, instead of update).
  bool sums_only = false;
  MatrixView staged;
  DeviceMatrix exp_avg, exp_avg_sq;                // AdamW: shard-shaped, compute's memory
  std::optional<TpMode> mode;                      // Muon: the mode used (auto: once planned)
  NsAlgorithm algorithm = NsAlgorithm::kStandard;  // Muon: the NS algorithm (auto: planned)
  std::optional<AutoKey> auto_key;                 // auto: the key it was resolved on
  // Muon, replicated: orthogonalised on one home of its replicas (decided with its mode).
  std::optional<bool> home;
  bool dp_crosses = false;  // replica_mode auto: whether its replicas cross an NVLink domain
  int owner = -1;           // owner mode or home: its owner index in the last step
  std::vector<int> owners;  // each slice's owner index in the last step (-1: run locally)
  bool sharded() const { return layout.tp_dim != kNoPartition || layout.gtp_size > 1; }
  // An unsharded weight whose every slice another replica's home orthogonalised this step: its
  // update here is the home's, copied bit for bit.
  bool homed_elsewhere() const {
    return home.value_or(false) && !sharded() && !owners.empty() &&
           std::none_of(owners.begin(), owners.end(), [&](int o) { return o == layout.dp_rank; });
  }
};

struct AutoState;  // muon_auto.cpp

// The per-element constants of Muon's momentum step from the options (muon.cpp).
MomentumStep momentum_step(const MuonOptions& o);

struct Muon::Impl {
  MuonOptions options;
  NsOptions ns;
  Communicator world;
  Compute* compute;                 // every operation on the matrices (never null)
  detail::NsWorkspaces workspaces;  // NS scratch and gathered buffers per shape, kept across steps
  std::vector<ParamState> params;
  std::int64_t step = 0;
  // The step deadline (options.step_timeout_s or DISTMUON_STEP_TIMEOUT; 0: none), agreed with
  // the configuration.
  double step_timeout = 0;
  bool prepared = false;  // configuration checked across the world since the last registration
  std::shared_ptr<double> comm_seconds = std::make_shared<double>(0.0);
  // A device backend's timer of its data plane's collectives (Compute::stream_timer; nullptr on
  // the CPU): read into comm_seconds at the end of each step, once the step's work completed.
  std::unique_ptr<StreamTimer> comm_timer;
  // The caller's groups with the backend's data plane attached, both planes timed.
  std::map<const CommImpl*, Communicator> timed;
  MuonStepStats last;
  // The batched checks (validate_gradients, check_updates): the views checked and their
  // results, kept across steps.
  mutable std::vector<ConstMatrixView> check_views;
  mutable std::vector<std::optional<MatrixIndex>> check_results;
  std::vector<MuonDirection> directions;  // validate_gradients: the stepping Muon parameters
  // Per parameter: its weight's sum of squares (every row) when validate_gradients' pass took it
  // (replicated stepping Muon weights, for their fingerprints); check_updates reuses it.
  std::vector<std::optional<double>> weight_sums;
  std::unique_ptr<AutoState, void (*)(AutoState*)> auto_state{nullptr, nullptr};
  // The compute phase's orthogonalisation of every mode; holds owner mode's assignments.
  detail::WeightOrthogonalizer orthogonalizer;
  std::vector<detail::ShardedWeight> step_weights;  // the step's weights, kept across steps
  std::vector<std::size_t> step_params;             // the parameter of each step weight
  NsOptions ns_gram;                                // ns with the Gram algorithm
  std::vector<double> fingerprints;                 // replicated weights' and NS inputs' sums
  std::size_t plan_timed_runs = 0;                  // plan measure: candidate runs timed

  Impl(MuonOptions o, Communicator w, Compute& c);
  // The bfloat16 weights (ParamSpec::bf16) for one step: each unpacked into a float32 copy that
  // spec.local views (hold_bf16_weights), packed back rounded once its step applied
  // (store_bf16_weight; nothing for a weight of float32), the copies released however the step
  // ends (release_bf16_weights).
  void hold_bf16_weights();
  // State tensor k of p (Muon::state_to_host, state_from_host), whatever its storage.
  Matrix state_to_host(const ParamState& p, std::size_t k) const;
  void state_from_host(ParamState& p, std::size_t k, ConstMatrixView host);
  void store_bf16_weight(ParamState& p);
  void release_bf16_weights() noexcept;
  // The rank-independent configuration: options and every parameter's global metadata.
  nlohmann::json config() const;
  // Collective over the world: the configuration is the same on every rank, else
  // CollectiveError on every rank naming the first difference.
  void prepare();
  // Gives every Muon parameter its mode and NS algorithm: fixed by the options, or planned by
  // tp_mode=auto for all pending parameters at once (collective over the world). Called before
  // a step's first collective.
  void plan();
  // The algorithm of a parameter whose mode is not planned by auto.
  NsAlgorithm fixed_algorithm() const;
  // Collective over the world: every gradient matches its shard and is finite, and so are every
  // weight and optimizer state (padding rows aside), else CollectiveError on every rank naming
  // the parameter. Nothing is updated. In the same pass over their memory (Compute::
  // muon_directions): every stepping Muon parameter's momentum direction into p.update (the
  // compute phase's input to NS; the momentum is not written), and the replicated ones'
  // fingerprints (check_replicas) and weight sums (weight_sums).
  // failure: this rank's caller already failed (grads unread); agreed in the same collective.
  // The options and `active` (empty: every parameter) are agreed in the same collective
  // (CollectiveError on every rank naming the first difference); grads of inactive parameters
  // are not read.
  void validate_gradients(std::span<const ConstMatrixView> grads, std::string_view failure,
                          std::span<const std::uint8_t> active);
  // Replaces the options (validated by the caller) and what is derived from them.
  void use_options(MuonOptions o);
  std::string options_text;  // the options' JSON, agreed at every step
  // The end of the step's compute phase, on every backend (weight_range.cpp): one batched sum
  // of squares (in double) of what every stepping parameter's step reads, from which (a) every
  // Muon update is finite (a non-finite NS input leaves it NaN; its first such element is then
  // found for the message), (b) no AdamW gradient takes the second moment past float32's range
  // (adamw_overflow), (c) no step's new weights can leave that range (bounded by norms); agreed
  // over the world (CollectiveError on every rank naming the first failing rank's parameter)
  // before anything is written. replicas: a failure of the replicas' fingerprint check
  // (check_replicas), agreed with the rest.
  void check_updates(std::span<const ConstMatrixView> grads, std::span<const std::uint8_t> active,
                     std::string_view replicas) const;
  // Replicated stepping weights: the fingerprints of every replica's weight and NS input
  // (p.update: gradient and momentum), their sums of squares taken by validate_gradients,
  // all-gathered over each replica group (control plane; one collective per group, in the order
  // of the groups' first weights).
  // Returns this rank's failure text (empty: every replica of every weight agrees), for
  // check_updates to agree over the world.
  std::string check_replicas(std::span<const std::uint8_t> active);
  // The step's weights (step_weights, step_params) from the planned stepping Muon parameters,
  // each p.result at its update.
  void collect_step_weights(std::size_t n, std::span<const std::uint8_t> active);
  // Before the step's first collective, when every stepping Muon parameter is planned and owner
  // mode's plans of their buckets are cached (the plans run() takes: the homes cannot differ),
  // per unsharded replicated parameter of one matrix: sums_only when another replica's home will
  // orthogonalise it (this rank only fingerprints its NS input), staged when this rank will (its
  // NS input goes straight into its place in the replicas' send staging). Otherwise neither. No
  // collective.
  void plan_homes(std::size_t n, std::string_view failure, std::span<const std::uint8_t> active);
  // Whether a Muon parameter with its mode set runs on one home of its replicas.
  bool runs_on_home(const ParamState& p) const;
  // The NS options of a planned parameter (its algorithm).
  const NsOptions& ns_of(const ParamState& p) const {
    return p.algorithm == NsAlgorithm::kGram ? ns_gram : ns;
  }
};

// tp_mode=auto (muon_auto.cpp). The resolver of the options' profile and cost model; throws on
// an invalid profile or model.
std::unique_ptr<AutoState, void (*)(AutoState*)> make_auto_state(const MuonOptions& options);
// Plans the mode and algorithm of every Muon parameter without one (collective over the world:
// world rank 0 plans each bucket of parameters sharing their groups, and shares the result).
void plan_auto_modes(Muon::Impl& impl);
// replica_mode auto with tp_mode auto: whether each of todo's parameters (unsharded, replicated,
// in no home yet) runs on a home of its replicas, by the cost model per bucket of parameters with
// the same replicas (estimate_replica_bucket; world rank 0 decides and shares). Collective over
// the world.
void plan_replica_homes(Muon::Impl& impl, std::span<const std::size_t> todo);
// plan_auto_modes with plan=measure (muon_measure.cpp): keys per todo parameter (crossing agreed),
// buckets of parameter indices sharing their groups. Collective over the world.
void plan_auto_modes_by_measuring(Muon::Impl& impl, std::span<const std::size_t> todo,
                                  std::span<const AutoKey> keys,
                                  std::span<const std::vector<std::size_t>> buckets);
// The profile tp_mode=auto prices with (nullptr: none, or no auto option).
const HardwareProfile* auto_profile(const Muon::Impl& impl);
// The chunk count of each owner bucket composition the optimizer runs (muon_chunks.cpp): the cost
// model's cheapest pipelined schedule (kChosenChunks) on the keys auto prices the bucket with;
// without a profile the unpriced count (kUnpricedChunks). No collective: a function of the
// parameters' agreed metadata and the options.
detail::OwnerChunksFn owner_chunks(const Muon::Impl& impl);
// Restores a saved decision into the resolver's cache (checkpoint load).
void restore_auto_decision(Muon::Impl& impl, const AutoKey& key, const AutoChoice& choice);

void to_json(nlohmann::json& j, const AutoKey& k);
void from_json(const nlohmann::json& j, AutoKey& k);

}  // namespace distmuon
