// Muon: registration, the configuration check across ranks, and the step.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>

#include "core/fault.h"
#include "distmuon/agreement.h"
#include "distmuon/checkpoint.h"
#include "distmuon/error.h"
#include "distmuon/hash.h"
#include "optim/muon_impl.h"
#include "optim/timed_comm.h"

namespace distmuon {

MomentumStep momentum_step(const MuonOptions& o) {
  const bool l2 = o.weight_decay_method == WeightDecayMethod::kL2;
  return {static_cast<float>(o.momentum), static_cast<float>(l2 ? o.weight_decay : 0.0),
          o.nesterov};
}

namespace {

// The apply phase, once the step's updates are agreed finite over the world: the momentum step
// again, on the momentum itself (elementwise and deterministic: the same values as in the compute
// phase, recomputed instead of kept), the weight decay, then w -= lr u, in one pass where the
// backend fuses them (Compute::muon_apply).
void muon_apply(Muon::Impl& s, ParamState& p, ConstMatrixView g) {
  const MuonOptions& o = s.options;
  float decay = 1.0f;
  if (o.weight_decay != 0.0 && o.weight_decay_method != WeightDecayMethod::kL2) {
    decay = static_cast<float>(o.weight_decay_method == WeightDecayMethod::kDecoupled
                                   ? 1.0 - o.lr * o.weight_decay
                                   : 1.0 - o.weight_decay);
  }
  s.compute->muon_apply(momentum_step(o), g, p.spec.local, p.momentum.view(), p.result, decay,
                        static_cast<float>(o.lr));
}

detail::ScaleFn muon_scale_fn(const MuonOptions& o) {
  return [mode = o.scale_mode, extra = o.extra_scale_factor](Index m, Index n) {
    return muon_scale(mode, m, n) * extra;
  };
}

}  // namespace

Muon::Impl::Impl(MuonOptions o, Communicator w, Compute& c)
    : options(std::move(o)),
      ns(options.ns_options(c.default_precision())),
      world(std::move(w)),
      compute(&c),
      comm_timer(c.stream_timer()),
      orthogonalizer({}, options.replica_wire == ReplicaWire::kBf16, owner_chunks(*this)),
      ns_gram(ns) {
  // The schedule at the precision NS runs at (the backend's when the options leave it): a
  // schedule that its rounding makes diverge is refused here, before any step.
  ns.validate();
  ns_gram.algorithm = NsAlgorithm::kGram;
  options_text = nlohmann::json(options).dump();
  // The bf16 wire needs the backend's packing: refused here, on every rank, before any collective.
  if (options.replica_wire == ReplicaWire::kBf16) compute->pack_bf16({}, nullptr);
  step_timeout = step_timeout_seconds(options.step_timeout_s);
  if (step_timeout > 0 && world.size() > 1 && !world.impl().has_gate()) {
    throw Error(fmt::format(
        "Muon: a step deadline of {:g} s needs point-to-point messages, which the {} communicator "
        "does not have (use an MPI communicator, or step_timeout 0)",
        step_timeout, world.backend()));
  }
}

void Muon::Impl::use_options(MuonOptions o) {
  NsOptions n = o.ns_options(compute->default_precision());
  n.validate();
  NsOptions g = n;
  g.algorithm = NsAlgorithm::kGram;
  std::string text = nlohmann::json(o).dump();
  options = std::move(o);
  ns = std::move(n);
  ns_gram = std::move(g);
  options_text = std::move(text);
}

NsAlgorithm Muon::Impl::fixed_algorithm() const {
  return options.ns_algorithm == NsAlgorithm::kAuto ? NsAlgorithm::kStandard : options.ns_algorithm;
}

nlohmann::json Muon::Impl::config() const {
  nlohmann::json list = nlohmann::json::array();
  for (const ParamState& p : params) {
    const ParamSpec& s = p.spec;
    list.push_back({{"name", s.name},
                    {"rows", s.rows},
                    {"cols", s.cols},
                    {"role", to_string(s.role)},
                    {"muon", p.muon},
                    {"tp_partition_dim", p.layout.tp_dim},
                    {"tp_size", p.layout.tp_size},
                    {"gtp_size", p.layout.gtp_size},
                    {"pad_length", p.layout.pad},
                    {"tp_pad_length", p.layout.tp_pad},
                    {"dp_size", p.layout.dp_size},
                    {"expert", s.expert},
                    {"qkv_split", s.qkv_split},
                    {"batch", p.layout.batch},
                    // How the weight is stored (ParamSpec::bf16): a rank that stores it otherwise
                    // would round it otherwise, so the ranks agree on it.
                    {"weight_dtype", s.bf16 != nullptr ? "bf16" : "fp32"}});
  }
  // The precision NS runs at, resolved on this rank (options.precision auto: the backend's),
  // agreed with the rest: it decides Gram NS's restarts, so the count of its collectives.
  return {{"options", options},
          {"params", list},
          {"ns_precision", to_string(ns.precision)},
          {"step_deadline_s", step_timeout}};
}

void Muon::Impl::prepare() {
  if (prepared) return;
  // On a mismatch every differing rank names its first difference from rank 0's configuration.
  agree_on(world, config().dump(), "Muon: the optimizer configuration (options, parameters)",
           explain_json_difference);
  prepared = true;
}

void Muon::Impl::plan() {
  bool pending = false;
  for (ParamState& p : params) {
    if (!p.muon || p.mode) continue;
    if (const TpMode mode = options.mode_for(p.spec.expert); mode != TpMode::kAuto) {
      p.mode = mode;
      p.algorithm = fixed_algorithm();
    } else {
      pending = true;
    }
  }
  if (pending) plan_auto_modes(*this);
  std::vector<std::size_t> priced;  // replica_mode auto, tp_mode auto: the cost model decides
  for (std::size_t i = 0; i < params.size(); ++i) {
    ParamState& p = params[i];
    if (!p.muon || !p.mode || p.home) continue;
    if (options.replica_mode == ReplicaMode::kAuto &&
        options.mode_for(p.spec.expert) == TpMode::kAuto && p.layout.dp_on() && !p.sharded()) {
      priced.push_back(i);
    } else {
      p.home = runs_on_home(p);
    }
  }
  if (!priced.empty()) plan_replica_homes(*this, priced);
}

void Muon::Impl::collect_step_weights(std::size_t n, std::span<const std::uint8_t> active) {
  step_weights.clear();
  step_params.clear();
  for (std::size_t i = 0; i < n; ++i) {
    ParamState& p = params[i];
    if (!p.muon || (!active.empty() && active[i] == 0)) continue;  // agreed over the world
    const bool home = p.home.value_or(false);
    const Index rows = p.layout.shard_rows();
    const MatrixView update = p.staged.data != nullptr ? p.staged : p.update.view();
    p.result = update;
    for (Index b = 0; b < p.layout.batch; ++b) {  // a batched parameter: one weight per slice
      step_params.push_back(i);
      step_weights.push_back({update.row_block(b * rows, rows), &p.layout, &p.tp, &p.gtp,
                              home ? TpMode::kOwner : *p.mode, p.algorithm, home ? &p.dp : nullptr,
                              // one weight: its update may stay where it arrives
                              p.layout.batch == 1 ? &p.result : nullptr});
    }
  }
}

void Muon::Impl::plan_homes(std::size_t n, std::string_view failure,
                            std::span<const std::uint8_t> active) {
  for (ParamState& p : params) {
    p.sums_only = false;
    p.staged = {};
  }
  if (!failure.empty() || n != params.size() || (!active.empty() && active.size() != n)) return;
  for (std::size_t i = 0; i < n; ++i) {
    ParamState& p = params[i];
    if (!p.muon || (!active.empty() && active[i] == 0)) continue;
    if (!p.mode || !p.home) return;  // plan() decides
    p.update.ensure(*compute, p.spec.local.rows, p.spec.local.cols);
  }
  collect_step_weights(n, active);
  const auto cached = orthogonalizer.cached_plan(step_weights, *compute, workspaces);
  if (!cached) return;
  for (std::size_t w = 0; w < step_weights.size(); ++w) {
    ParamState& p = params[step_params[w]];
    if (!*p.home || p.sharded() || p.layout.batch != 1) continue;
    const int owner = cached->owners[w];
    p.sums_only = owner >= 0 && owner != p.layout.dp_rank;
    // Padding rows aside, the staging holds what NS reads: every row of the update.
    if (owner == p.layout.dp_rank) p.staged = cached->send[w];
  }
}

bool Muon::Impl::runs_on_home(const ParamState& p) const {
  return p.layout.dp_on() && options.replica_mode != ReplicaMode::kEveryRank &&
         (!p.sharded() || *p.mode == TpMode::kOwner);
}

Muon::Muon(MuonOptions options, Communicator world, Compute& compute) {
  options.validate();
  impl_ = std::make_unique<Impl>(std::move(options), std::move(world), compute);
  if (impl_->options.any_auto()) impl_->auto_state = make_auto_state(impl_->options);
}
Muon::~Muon() = default;
Muon::Muon(Muon&&) noexcept = default;
Muon& Muon::operator=(Muon&&) noexcept = default;

std::size_t Muon::add_parameter(ParamSpec spec) {
  Impl& s = *impl_;
  const std::string what = fmt::format("Muon::add_parameter '{}'", spec.name);
  if (spec.name.empty()) throw Error("Muon::add_parameter: a parameter needs a name");
  for (const ParamState& p : s.params) {
    if (p.spec.name == spec.name) throw Error(what + ": the name is already registered");
  }
  // Each group once: the backend's data plane attached (unless the caller attached one), and
  // both planes timed.
  auto timed = [&](const std::optional<Communicator>& g) {
    const Communicator c = g ? *g : local_communicator();
    auto [it, fresh] = s.timed.try_emplace(c.impl_ptr().get(), c);
    if (fresh) {
      const Communicator planes = c.has_data_plane() ? c : s.compute->data_communicator(c);
      it->second = detail::timed_communicator(planes, s.comm_seconds, s.comm_timer.get());
    }
    return it->second;
  };
  ParamState p(std::move(spec), timed(std::nullopt), timed(std::nullopt), timed(std::nullopt));
  const ParamSpec& ps = p.spec;
  detail::ShardLayout& l = p.layout;
  l.m = ps.rows;
  l.n = ps.cols;
  l.pad = ps.pad_length;
  l.tp_pad = ps.tp_pad_length;
  l.qkv = ps.qkv_split;
  l.batch = ps.batch;
  if (ps.tp_partition_dim != kNoPartition && ps.tp_group && ps.tp_group->size() > 1) {
    p.tp = timed(ps.tp_group);
    l.tp_dim = ps.tp_partition_dim;
    l.tp_size = p.tp.size();
    l.tp_rank = p.tp.rank();
  } else if (ps.tp_pad_length != 0) {
    throw Error(fmt::format("{}: TP pad {} without a TP split over more than one rank", what,
                            ps.tp_pad_length));
  }
  if (ps.gtp_sharded && ps.gtp_group) {
    p.gtp = timed(ps.gtp_group);
    l.gtp_size = p.gtp.size();
    l.gtp_rank = p.gtp.rank();
  }
  if (ps.dp_group && ps.dp_group->size() > 1) {
    p.dp = timed(ps.dp_group);
    l.dp_size = p.dp.size();
    l.dp_rank = p.dp.rank();
  }
  // The groups live on as p.tp, p.gtp and p.dp (timed, with the backend's data plane): the spec
  // keeps no second copy of them.
  p.spec.tp_group.reset();
  p.spec.gtp_group.reset();
  p.spec.dp_group.reset();
  if (ps.tp_partition_dim != kNoPartition && ps.tp_partition_dim != 0 && ps.tp_partition_dim != 1) {
    throw Error(
        fmt::format("{}: TP partition dim {} (valid: none, 0, 1)", what, ps.tp_partition_dim));
  }
  l.validate(what);
  if (ps.bf16 != nullptr) {
    if (ps.local.data != nullptr || ps.local.ld != ps.local.cols) {
      throw Error(
          fmt::format("{}: a bfloat16 weight is given by its bf16 elements alone (the "
                      "local view only its shape, {}, without data and with ld = cols)",
                      what, shape_str(ps.local)));
    }
    s.compute->pack_bf16({}, nullptr);  // a backend without bf16 packing refuses here
  }
  if (ps.local.rows != l.batch * l.shard_rows() || ps.local.cols != l.n_tp() ||
      ps.local.ld < ps.local.cols ||
      (ps.local.data == nullptr && ps.bf16 == nullptr && ps.local.size() > 0)) {
    throw Error(fmt::format(
        "{}: the local shard is {} but a {} weight (TP {} on dim {}, TP pad {}, pad {}, GTP {}) "
        "has {} shards{}",
        what, shape_str(ps.local), shape_str(l.m, l.n), l.tp_size, l.tp_dim, l.tp_pad, l.pad,
        l.gtp_size, shape_str(l.shard_rows(), l.n_tp()),
        l.batch == 1 ? std::string()
                     : fmt::format(", {} of them stacked by rows in a batch of {} ({} rows)",
                                   l.batch, l.batch, l.batch * l.shard_rows())));
  }
  p.muon = ps.use_muon && ps.role == ParamRole::kHidden;
  if (p.muon && ps.bf16 != nullptr && s.options.momentum_dtype == MomentumDtype::kParam) {
    // Kept in bf16 (zero bits: a zero momentum); a float32 copy for each step only.
    p.momentum16 = DeviceMatrix(*s.compute, 1, (ps.local.size() + 1) / 2);
  } else if (p.muon) {
    p.momentum = DeviceMatrix(*s.compute, ps.local.rows, ps.local.cols);
  }
  if (p.muon) {
    // One full matrix per rank: plain NS whatever the mode; auto has nothing to decide.
    if (!p.sharded() && s.options.mode_for(ps.expert) == TpMode::kAuto) {
      p.mode = TpMode::kDuplicated;
      p.algorithm = s.fixed_algorithm();
    }
  } else {
    p.exp_avg = DeviceMatrix(*s.compute, ps.local.rows, ps.local.cols);
    p.exp_avg_sq = DeviceMatrix(*s.compute, ps.local.rows, ps.local.cols);
  }
  s.params.push_back(std::move(p));
  s.prepared = false;
  return s.params.size() - 1;
}

void Muon::step(std::span<const ConstMatrixView> grads) {
  step(grads, {}, {});
}

void Muon::step(std::span<const ConstMatrixView> grads, std::string_view failure) {
  step(grads, failure, {});
}

void Muon::step(std::span<const ConstMatrixView> grads, std::string_view failure,
                std::span<const std::uint8_t> active) {
  Impl& s = *impl_;
  const auto start = std::chrono::steady_clock::now();
  *s.comm_seconds = 0.0;
  if (s.comm_timer) s.comm_timer->clear();  // a failed step's intervals are not this step's
  s.prepare();
  // Every rank reaches this step within the step deadline, or the late rank is named.
  pass_step_gate(s.world, s.step + 1, s.step_timeout, "optimizer step");
  // bf16 weights: float32 copies for this step, released however it ends. A failure to make one
  // (out of memory) is this rank's: it fails the step on every rank through the agreement below.
  std::string held;
  try {
    s.hold_bf16_weights();
  } catch (const std::bad_alloc&) {
    held = "out of memory making the float32 copies of the bfloat16 weights for the step";
  } catch (const Error& e) {
    held = e.what();
  }
  struct Release {
    Muon::Impl& s;
    ~Release() { s.release_bf16_weights(); }
  } release{s};
  if (!held.empty() && failure.empty()) failure = held;
  s.plan_homes(grads.size(), failure, active);
  s.validate_gradients(grads, failure, active);
  s.plan();
  // The compute phase: every Muon update, nothing written but the updates. Code running over
  // the parameters' groups (a subset of the world) never throws for data: a non-finite NS input
  // leaves that update NaN, and one agreement over the world (check_updates) ends the phase.
  // Per stepping Muon parameter its momentum direction is in p.update (validate_gradients), then
  // every update orthogonalised in place by one call (its mode and algorithm:
  // weight_orthogonalizer.h). A non-finite NS input leaves the update NaN (no throw: the ranks of
  // the parameter's groups are only part of the world); check_updates finds it.
  s.collect_step_weights(grads.size(), active);
  // Before NS: a home's result replaces every replica's update, so a replica that differs would
  // go unnoticed after it.
  const std::string replicas = s.check_replicas(active);
  s.orthogonalizer.run(s.step_weights, s.ns, muon_scale_fn(s.options), *s.compute, &s.workspaces);
  std::size_t owned = 0;  // last_owners() lists the owner weights in order
  for (const std::size_t i : s.step_params)
    s.params[i].owners.clear();
  for (std::size_t w = 0; w < s.step_weights.size(); ++w) {
    if (s.step_weights[w].mode != TpMode::kOwner) continue;
    ParamState& p = s.params[s.step_params[w]];
    p.owners.push_back(s.orthogonalizer.last_owners()[owned++]);
    p.owner = p.owners.front();
  }
  for (const ParamState& p : s.params) {
    DISTMUON_ASSERT(!p.sums_only || p.homed_elsewhere(),
                    "an NS input left unstored is orthogonalised on another replica");
    DISTMUON_ASSERT(p.staged.data == nullptr || (p.owner == p.layout.dp_rank && !p.sharded()),
                    "an NS input in the send staging is orthogonalised here");
  }
  // Every backend: one batched check (the updates finite, AdamW's second moment and the new
  // weights within float32's range), one agreement (with the replicas' check).
  s.check_updates(grads, active, replicas);
  // The apply phase: rank-local, no collective.
  ++s.step;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    ParamState& p = s.params[i];
    if (!active.empty() && active[i] == 0) continue;
    if (i == grads.size() / 2) detail::fault_point("optim-step");  // docs/reliability.md
    if (p.muon) {
      muon_apply(s, p, grads[i]);
    } else {
      adamw_update(p.spec.local, grads[i], p.exp_avg.view(), p.exp_avg_sq.view(), s.step,
                   s.options.adamw, *s.compute);
    }
    s.store_bf16_weight(p);  // with its state: a step ended early leaves each weight whole
  }
  if (s.comm_timer) *s.comm_seconds += s.comm_timer->seconds();
  s.last = {std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            *s.comm_seconds};
}

std::int64_t Muon::step_count() const {
  return impl_->step;
}
const MuonOptions& Muon::options() const {
  return impl_->options;
}
MuonStepStats Muon::last_step_stats() const {
  return impl_->last;
}

namespace {

// Applies change to a copy of the options and keeps it only when it validates.
template <class F>
void change_options(Muon::Impl& s, F change) {
  MuonOptions o = s.options;
  change(o);
  o.validate();
  s.use_options(std::move(o));
}

}  // namespace

void Muon::set_options(const MuonOptions& options) {
  const MuonOptions& cur = impl_->options;
  const nlohmann::json now = cur, next = options;
  for (const char* fixed :
       {"tp_mode", "expert_tp_mode", "replica_mode", "replica_wire", "momentum_dtype",
        "ns_algorithm", "gram_restart", "use_syrk", "precision", "cost_model", "profile", "plan",
        "wisdom", "step_timeout_s"}) {
    if (now.at(fixed) != next.at(fixed)) {
      throw Error(fmt::format(
          "Muon::set_options: {} is fixed once the optimizer is built ({} now, {} asked)", fixed,
          now.at(fixed).dump(), next.at(fixed).dump()));
    }
  }
  change_options(*impl_, [&](MuonOptions& o) { o = options; });
}

void Muon::set_learning_rates(double muon_lr, double adamw_lr) {
  change_options(*impl_, [&](MuonOptions& o) {
    o.lr = muon_lr;
    o.adamw.lr = adamw_lr;
  });
}

void Muon::set_weight_decays(double muon_wd, double adamw_wd) {
  change_options(*impl_, [&](MuonOptions& o) {
    o.weight_decay = muon_wd;
    o.adamw.weight_decay = adamw_wd;
  });
}

void Muon::set_step_count(std::int64_t step) {
  if (step < 0) throw Error(fmt::format("Muon::set_step_count: step {} < 0", step));
  impl_->step = step;
}

std::vector<ParamInfo> Muon::parameters() const {
  std::vector<ParamInfo> out;
  for (const ParamState& p : impl_->params) {
    out.push_back({p.spec.name, p.muon, p.spec.rows, p.spec.cols, p.layout.tp_size,
                   p.layout.gtp_size, p.muon ? p.mode : std::nullopt, p.algorithm,
                   p.auto_key ? std::optional<bool>(p.auto_key->crosses_domain) : std::nullopt,
                   p.layout.dp_size, p.home.value_or(false), p.owner, p.layout.batch, p.owners});
  }
  return out;
}

}  // namespace distmuon
