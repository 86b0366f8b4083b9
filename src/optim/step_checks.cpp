// Muon::Impl::validate_gradients and check_replicas: the checks of a step before its Newton-Schulz
// (the inputs finite, the momentum directions and the replicas' fingerprints in one pass, the
// replicas equal), agreed over the world (muon_impl.h). check_updates, after NS: weight_range.cpp.
#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/hash.h"
#include "optim/muon_impl.h"

namespace distmuon {

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
          s.directions.push_back(
              {grads[i].row_block(at, rows), w.row_block(at, rows),
               p.momentum.view().row_block(at, rows),
               (p.staged.data != nullptr ? p.staged : p.update.view()).row_block(at, rows),
               rows - l.local_pad(), l.dp_on(), l.dp_on() && p.sums_only});
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

}  // namespace distmuon
