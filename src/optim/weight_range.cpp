// Muon::Impl::check_updates: the end of a step's compute phase, before anything is written
// (muon_impl.h).
#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <vector>

#include "distmuon/adamw.h"
#include "distmuon/agreement.h"
#include "optim/muon_impl.h"

namespace distmuon {
namespace {

// One parameter's place in the batch: its sums (Muon: weight, update; AdamW: weight, m, g, v)
// start at `first`, except a Muon weight's sum that the compute phase took already (`weight`:
// then its update's sum is at `first`), and the factors of its step.
struct Bound {
  std::size_t param;
  bool muon;
  double decay, lr, adam_scale;  // adam_scale: lr / ((1 - beta1^t) eps) for AdamW
  std::size_t first;
  std::optional<double> weight;
  // Where sum k of the list above is in the batch's views and sums.
  std::size_t at(std::size_t k) const { return first + k - (weight ? 1 : 0); }
};

}  // namespace

// One batched sum of squares (in double) of what every stepping parameter's step reads (a
// replicated Muon weight's, unpadded, is its fingerprint's, taken by validate_gradients), then:
//  0. Muon: each update finite (a finite float's square cannot overflow a double's sum, so a
//     non-finite sum means a non-finite element, then found by find_non_finite for the message);
//  1. AdamW: a finite gradient that would take the second moment past float32's range
//     (adamw_overflow, from the sums of g and v);
//  2. the new weights' range, bounded by norms, so that no step writes an infinity:
//     - Muon: w' = f w - lr u (f the decay factor, u the orthogonalised and scaled update), so
//       |w'_ij| <= |f| ||w||_F + lr ||u||_F;
//     - AdamW: p' = f p - lr m' / ((1 - beta1^t)(sqrt(v') + eps)), m' = beta1 m + (1 - beta1) g,
//       so |p'_ij| <= |f| ||p||_F + lr (beta1 ||m||_F + (1 - beta1) ||g||_F) / ((1 - beta1^t) eps).
// The bounds hold whatever the values; they refuse only steps whose bound comes within 1e-5 of
// float32's largest value (weights or learning rates near 1e38, or AdamW's lr |m| / eps past it),
// where a real run has long diverged. The weights themselves were checked finite before the step.
void Muon::Impl::check_updates(std::span<const ConstMatrixView> grads,
                               std::span<const std::uint8_t> active,
                               std::string_view replicas) const {
  std::vector<Bound> bounds;
  std::vector<ConstMatrixView> views, adam_g, adam_v;
  std::vector<std::size_t> adam_params;
  const AdamWOptions& a = options.adamw;
  const double t = static_cast<double>(step + 1);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamState& p = params[i];
    if (!active.empty() && active[i] == 0) continue;
    const ConstMatrixView w = p.spec.local;
    // A result received from another replica's home is checked where it arrived (p.result):
    // what the exchange delivered is what the apply phase reads.
    if (p.muon) {
      const double f = options.weight_decay == 0 ? 1.0
                       : options.weight_decay_method == WeightDecayMethod::kDecoupled
                           ? 1.0 - options.lr * options.weight_decay
                       : options.weight_decay_method == WeightDecayMethod::kIndependent
                           ? 1.0 - options.weight_decay
                           : 1.0;
      const Index rows = w.rows - p.layout.local_pad();  // padding ignored
      // The weight's sum over every row, when validate_gradients took it, is this one.
      const std::optional<double> taken =
          p.layout.local_pad() == 0 ? weight_sums[i] : std::optional<double>();
      bounds.push_back({i, true, f, options.lr, 0, views.size(), taken});
      if (!taken) views.push_back(w.row_block(0, rows));
      views.push_back(p.result.row_block(0, rows));
    } else {
      bounds.push_back({i, false, 1.0 - a.lr * a.weight_decay, a.lr,
                        a.lr / ((1.0 - std::pow(a.beta1, t)) * a.eps), views.size(), std::nullopt});
      views.insert(views.end(), {w, p.exp_avg.view(), grads[i], p.exp_avg_sq.view()});
      adam_g.push_back(grads[i]);
      adam_v.push_back(p.exp_avg_sq.view());
      adam_params.push_back(i);
    }
  }
  std::string reason(replicas);
  std::vector<double> sums(views.size());
  auto checks = [&]() -> std::string {
    compute->sum_squares(views, true, sums);
    for (const Bound& b : bounds) {
      if (!b.muon || std::isfinite(sums[b.at(1)])) continue;
      const auto bad = compute->find_non_finite(views[b.at(1)]);
      return fmt::format(
          "the update of weight '{}' is not finite at ({}, {}) of its shard: its Newton-Schulz "
          "input was not finite (a momentum step or a norm that overflows); nothing is updated",
          params[b.param].spec.name, bad ? bad->row : 0, bad ? bad->col : 0);
    }
    std::vector<double> g_sums, v_sums;
    for (const Bound& b : bounds) {
      if (b.muon) continue;
      g_sums.push_back(sums[b.first + 2]);
      v_sums.push_back(sums[b.first + 3]);
    }
    if (const auto bad = adamw_overflow(adam_g, adam_v, g_sums, v_sums, a, *compute)) {
      return fmt::format(
          "the AdamW step of parameter '{}' would overflow: its gradient {:g} at ({}, {}) takes "
          "the second moment (exp_avg_sq) past float32's range (beta2 = {}); nothing is updated "
          "(clip the gradients or scale the loss down)",
          params[adam_params[bad->index]].spec.name, bad->grad, bad->at.row, bad->at.col, a.beta2);
    }
    for (const Bound& b : bounds) {
      // A margin for float32's roundings below the largest value the weight is stored in: a
      // bfloat16 weight's (ParamSpec::bf16) rounds to infinity above bfloat16's largest.
      const bool bf16 = params[b.param].spec.bf16 != nullptr;
      const double largest = bf16 ? kMaxBfloat16 : kMaxFloat32;
      const double limit = largest * (1.0 - 1e-5);
      const double w = std::sqrt(b.weight ? *b.weight : sums[b.first]);
      const double step_size =
          b.muon ? b.lr * std::sqrt(sums[b.at(1)])
                 : b.adam_scale * (a.beta1 * std::sqrt(sums[b.first + 1]) +
                                   (1.0 - a.beta1) * std::sqrt(sums[b.first + 2]));
      const double bound = std::abs(b.decay) * w + step_size;
      if (!std::isfinite(bound) || bound <= limit) continue;  // non-finite: the checks above
      return fmt::format(
          "the step of {} parameter '{}' could take its weights past {}'s range: |weights| up "
          "to {:.3g} (Frobenius norm) and a step of up to {:.3g} (learning rate {:g}) against a "
          "largest value of {:.3g}; nothing is updated (lower the learning rate, or check the "
          "weights)",
          b.muon ? "Muon" : "AdamW", params[b.param].spec.name, bf16 ? "bfloat16" : "float32", w,
          step_size, b.lr, largest);
    }
    return {};
  };
  if (reason.empty() && !bounds.empty()) {
    try {
      reason = checks();
    } catch (const Error& e) {
      reason = e.what();
    }
  }
  agree_or_throw(world, reason.empty(), "Muon::step", reason);
}

}  // namespace distmuon
