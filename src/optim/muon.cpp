// Muon: registration, the configuration check across ranks, and the step.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/fault.h"
#include "distmuon/agreement.h"
#include "distmuon/checkpoint.h"
#include "distmuon/error.h"
#include "distmuon/hash.h"
#include "optim/muon_impl.h"
#include "optim/timed_comm.h"

namespace distmuon {
namespace {

MomentumStep momentum_step(const MuonOptions& o) {
  const bool l2 = o.weight_decay_method == WeightDecayMethod::kL2;
  return {static_cast<float>(o.momentum), static_cast<float>(l2 ? o.weight_decay : 0.0),
          o.nesterov};
}

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
  s.compute->muon_apply(momentum_step(o), g, p.spec.local, p.momentum.view(), p.update.view(),
                        decay, static_cast<float>(o.lr));
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
      orthogonalizer({}, options.replica_wire == ReplicaWire::kBf16),
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
                    {"batch", p.layout.batch}});
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
  if (ps.local.rows != l.batch * l.shard_rows() || ps.local.cols != l.n_tp() ||
      ps.local.ld < ps.local.cols || (ps.local.data == nullptr && ps.local.size() > 0)) {
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
  if (p.muon) {
    p.momentum = DeviceMatrix(*s.compute, ps.local.rows, ps.local.cols);
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

void Muon::Impl::validate_gradients(std::span<const ConstMatrixView> grads,
                                    std::string_view failure,
                                    std::span<const std::uint8_t> active) {
  Impl& s = *this;
  std::string reason(failure);
  if (reason.empty() && grads.size() != s.params.size()) {
    reason = fmt::format("{} gradients for {} parameters", grads.size(), s.params.size());
  }
  if (reason.empty() && !active.empty() && active.size() != s.params.size()) {
    reason = fmt::format("{} active flags for {} parameters", active.size(), s.params.size());
  }
  auto is_active = [&](std::size_t i) { return active.empty() || active[i] != 0; };
  for (std::size_t i = 0; reason.empty() && i < grads.size(); ++i) {
    if (!is_active(i)) continue;
    const MatrixView w = s.params[i].spec.local;
    if (grads[i].rows != w.rows || grads[i].cols != w.cols || grads[i].ld < grads[i].cols) {
      reason = fmt::format("gradient of '{}' is {}, its shard is {}", s.params[i].spec.name,
                           shape_str(grads[i]), shape_str(w));
    }
  }
  // Checked here, before any collective: a rank-local failure inside NS would strand the others.
  // Padding rows (the shard's trailing local_pad rows) are ignored. One batched check of every
  // gradient, weight and optimizer state (one result transfer on a device backend): with these
  // finite and a checked coefficient schedule (NsOptions::validate), no update is non-finite, so
  // a refused step leaves every weight at its last good value. The same call writes every
  // stepping Muon parameter's momentum direction into p.update (its gradient, weight and
  // momentum read once: Compute::muon_directions) and takes the replicated ones' fingerprints.
  if (reason.empty()) {
    struct Check {
      std::size_t at, param;  // its result in check_results, its parameter
      const char* kind;
      bool gradient;
      Index matrix = -1;  // a batched parameter's matrix (its own padding rows): which one
    };
    std::vector<Check> order;  // every gradient, then every weight and its states
    constexpr std::size_t kNone = ~std::size_t{0};
    // Per stepping Muon parameter its first direction and their count: one, or one per matrix of
    // a batched parameter with padding rows (each matrix's own padding rows are not checked).
    std::vector<std::size_t> direction_of(s.params.size(), kNone), directions_of(s.params.size());
    s.directions.clear();
    s.check_views.clear();
    s.weight_sums.assign(s.params.size(), std::nullopt);
    std::vector<double> sums;  // two per direction that asks (muon_directions)
    try {
      for (std::size_t i = 0; i < grads.size(); ++i) {
        ParamState& p = s.params[i];
        if (!p.muon || !is_active(i)) continue;
        const MatrixView w = p.spec.local;
        p.update.ensure(*s.compute, w.rows, w.cols);
        direction_of[i] = s.directions.size();
        const detail::ShardLayout& l = p.layout;
        const bool per_matrix = l.batch > 1 && l.local_pad() > 0;
        directions_of[i] = per_matrix ? static_cast<std::size_t>(l.batch) : 1;
        for (Index b = 0; b < static_cast<Index>(directions_of[i]); ++b) {
          const Index rows = per_matrix ? l.shard_rows() : w.rows;
          const Index at = b * rows;
          s.directions.push_back({grads[i].row_block(at, rows), w.row_block(at, rows),
                                  p.momentum.view().row_block(at, rows),
                                  p.update.view().row_block(at, rows), rows - l.local_pad(),
                                  l.dp_on()});
        }
      }
      const std::size_t first_other = 3 * s.directions.size();
      auto other = [&](ConstMatrixView v, std::size_t i, const char* kind, bool gradient) {
        const detail::ShardLayout& l = s.params[i].layout;
        if (l.local_pad() == 0 || l.batch == 1) {
          order.push_back({first_other + s.check_views.size(), i, kind, gradient});
          s.check_views.push_back(v.row_block(0, v.rows - l.local_pad()));
          return;
        }
        for (Index b = 0; b < l.batch; ++b) {  // each matrix's padding rows ignored
          order.push_back({first_other + s.check_views.size(), i, kind, gradient, b});
          s.check_views.push_back(v.row_block(b * l.shard_rows(), l.shard_rows() - l.local_pad()));
        }
      };
      // Each direction's three checks (gradient, weight, momentum) of parameter i.
      auto direction_checks = [&](std::size_t i, std::size_t k, const char* kind, bool gradient) {
        const bool per_matrix = directions_of[i] > 1;
        for (std::size_t b = 0; b < directions_of[i]; ++b)
          order.push_back({3 * (direction_of[i] + b) + k, i, kind, gradient,
                           per_matrix ? static_cast<Index>(b) : Index{-1}});
      };
      for (std::size_t i = 0; i < grads.size(); ++i) {
        if (direction_of[i] != kNone) {
          direction_checks(i, 0, "gradient of", true);
        } else if (is_active(i)) {  // a parameter without a gradient this step: nothing to check
          other(grads[i], i, "gradient of", true);
        }
      }
      for (std::size_t i = 0; i < grads.size(); ++i) {
        const ParamState& p = s.params[i];
        if (direction_of[i] != kNone) {
          direction_checks(i, 1, "weight", false);
          direction_checks(i, 2, "momentum state of", false);
        } else if (p.muon) {
          other(p.spec.local, i, "weight", false);
          other(p.momentum.view(), i, "momentum state of", false);
        } else {
          other(p.spec.local, i, "weight", false);
          other(p.exp_avg.view(), i, "AdamW first moment of", false);
          other(p.exp_avg_sq.view(), i, "AdamW second moment of", false);
        }
      }
      std::size_t summed = 0;
      for (const MuonDirection& d : s.directions)
        summed += d.sums ? 1 : 0;
      s.check_results.assign(first_other + s.check_views.size(), std::nullopt);
      sums.assign(2 * summed, 0.0);
      s.compute->muon_directions(momentum_step(s.options), s.directions, s.check_views,
                                 s.check_results, sums);
    } catch (const Error& e) {  // e.g. host memory passed to a device backend
      reason = e.what();
    }
    for (const Check& c : order) {
      if (!reason.empty()) break;
      if (const auto& bad = s.check_results[c.at]) {
        // A batched parameter's matrix and the row within it.
        const Index per_matrix = s.params[c.param].layout.shard_rows();
        const bool batched = s.params[c.param].layout.batch > 1;
        const Index matrix = c.matrix >= 0 ? c.matrix : batched ? bad->row / per_matrix : -1;
        const Index row = c.matrix < 0 && batched ? bad->row % per_matrix : bad->row;
        reason = fmt::format(
            "{} '{}'{} has a non-finite value at ({}, {}) of its shard{}", c.kind,
            s.params[c.param].spec.name,
            matrix < 0 ? std::string() : fmt::format(" (matrix {} of its batch)", matrix), row,
            bad->col, c.gradient ? "" : " before the step (nothing is updated)");
      }
    }
    // The replicas' fingerprints (check_replicas): per replicated parameter its weight's and its
    // NS input's sums of squares, a batched one's summed over its matrices in order (the same
    // order on every replica, so equal replicas give equal bits).
    s.fingerprints.clear();
    std::size_t at = 0;
    for (std::size_t i = 0; reason.empty() && i < grads.size(); ++i) {
      if (direction_of[i] == kNone || !s.directions[direction_of[i]].sums) continue;
      double w = 0, u = 0;
      for (std::size_t b = 0; b < directions_of[i]; ++b, at += 2) {
        w += sums[at];
        u += sums[at + 1];
      }
      s.fingerprints.push_back(w);
      s.fingerprints.push_back(u);
    }
    // The weights' sums of squares (every row) for check_updates.
    std::size_t f = 0;
    for (std::size_t i = 0; reason.empty() && i < grads.size(); ++i) {
      if (direction_of[i] != kNone && s.directions[direction_of[i]].sums) {
        s.weight_sums[i] = s.fingerprints[2 * f];
        ++f;
      }
    }
  }
  // One collective agrees this rank's checks, the options (schedules set them on every rank)
  // and which parameters step. Only when it fails do the ranks learn why: a failed check first,
  // else the first difference from rank 0.
  std::string agreed = s.options_text;
  agreed.append(reinterpret_cast<const char*>(active.data()), active.size());
  if (all_agree(s.world, fnv1a64(agreed.data(), agreed.size()), reason.empty())) return;
  agree_or_throw(s.world, reason.empty(), "Muon::step", reason);
  nlohmann::json mine = {{"options", nlohmann::json::parse(s.options_text)},
                         {"active", std::vector<int>(active.begin(), active.end())}};
  agree_on(s.world, mine.dump(), "Muon::step: the options and the parameters with a gradient",
           explain_json_difference);
}

std::string Muon::Impl::check_replicas(std::span<const std::uint8_t> active) {
  std::vector<std::size_t> which;  // replicated stepping Muon parameters
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamState& p = params[i];
    if (!p.muon || !p.layout.dp_on() || (!active.empty() && active[i] == 0)) continue;
    which.push_back(i);
  }
  if (which.empty()) return {};
  // Taken by validate_gradients' pass over them: per weight, its weight's sum of squares and its
  // NS input's (p.update: gradient and momentum), in the order of `which`.
  DISTMUON_ASSERT(fingerprints.size() == 2 * which.size(),
                  "two fingerprints per replicated weight");
  std::string reason;
  std::vector<bool> done(which.size(), false);
  for (std::size_t k = 0; k < which.size(); ++k) {
    if (done[k]) continue;
    const Communicator& dp = params[which[k]].dp;
    std::vector<std::size_t> group;  // the weights replicated over this group, in order
    for (std::size_t q = k; q < which.size(); ++q) {
      if (!done[q] && &params[which[q]].dp.impl() == &dp.impl()) {
        group.push_back(q);
        done[q] = true;
      }
    }
    const std::size_t n = 2 * group.size();  // per weight: its weight and its NS input
    std::vector<double> mine(n), all(n * static_cast<std::size_t>(dp.size()));
    for (std::size_t q = 0; q < group.size(); ++q) {
      mine[2 * q] = fingerprints[2 * group[q]];
      mine[2 * q + 1] = fingerprints[2 * group[q] + 1];
    }
    dp.all_gather<double>(mine, all);
    for (std::size_t q = 0; q < n && reason.empty(); ++q) {
      for (int r = 0; r < dp.size(); ++r) {
        const double theirs = all[static_cast<std::size_t>(r) * n + q];
        if (std::memcmp(&theirs, &mine[q], sizeof(double)) == 0) continue;
        reason = fmt::format(
            "the replicas of weight '{}' differ: replica {} of its {} data-parallel ranks holds a "
            "{} whose sum of squares is {:.17g}, replica {} (this rank) {:.17g}; replicated "
            "weights, gradients and optimizer states must be equal on every replica (gradients "
            "reduced over the data-parallel group before the step); nothing is updated",
            params[which[group[q / 2]]].spec.name, r, dp.size(),
            q % 2 == 0 ? "weight" : "Newton-Schulz input (gradient and momentum)", theirs,
            dp.rank(), mine[q]);
        break;
      }
    }
  }
  return reason;
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
  s.validate_gradients(grads, failure, active);
  s.plan();
  // The compute phase: every Muon update, nothing written but the updates. Code running over
  // the parameters' groups (a subset of the world) never throws for data: a non-finite NS input
  // leaves that update NaN, and one agreement over the world (check_updates) ends the phase.
  // Per stepping Muon parameter its momentum direction is in p.update (validate_gradients), then
  // every update orthogonalised in place by one call (its mode and algorithm:
  // weight_orthogonalizer.h). A non-finite NS input leaves the update NaN (no throw: the ranks of
  // the parameter's groups are only part of the world); check_updates finds it.
  s.step_weights.clear();
  s.step_params.clear();
  for (std::size_t i = 0; i < grads.size(); ++i) {
    ParamState& p = s.params[i];
    if (!p.muon || (!active.empty() && active[i] == 0)) continue;  // agreed over the world above
    const bool home = p.home.value_or(false);
    const Index rows = p.layout.shard_rows();
    for (Index b = 0; b < p.layout.batch; ++b) {  // a batched parameter: one weight per slice
      s.step_params.push_back(i);
      s.step_weights.push_back({p.update.view().row_block(b * rows, rows), &p.layout, &p.tp, &p.gtp,
                                home ? TpMode::kOwner : *p.mode, p.algorithm,
                                home ? &p.dp : nullptr});
    }
  }
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
       {"tp_mode", "expert_tp_mode", "replica_mode", "replica_wire", "ns_algorithm", "gram_restart",
        "use_syrk", "precision", "cost_model", "profile", "plan", "wisdom", "step_timeout_s"}) {
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

std::vector<MatrixView> Muon::state_tensors(std::size_t i) {
  if (i >= impl_->params.size()) {
    throw Error(fmt::format("Muon::state_tensors: parameter {} of {}", i, impl_->params.size()));
  }
  ParamState& p = impl_->params[i];
  if (p.muon) return {p.momentum.view()};
  return {p.exp_avg.view(), p.exp_avg_sq.view()};
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
