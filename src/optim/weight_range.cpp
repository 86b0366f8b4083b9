// Muon::Impl::check_weight_range: a step whose new weights could leave float32's range is
// refused before anything is written (muon_impl.h).
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "distmuon/adamw.h"
#include "optim/muon_impl.h"

namespace distmuon {

// Bounds each stepping parameter's new elements by norms of what the step reads, one batched
// sum of squares (in double) for all of them:
//  - Muon: w' = f w - lr u (f the decay factor), so |w'_ij| <= |f| ||w||_F + lr ||u||_F, with u
//    the orthogonalised and scaled update;
//  - AdamW: p' = f p - lr m' / ((1 - beta1^t)(sqrt(v') + eps)), m' = beta1 m + (1 - beta1) g, so
//    |p'_ij| <= |f| ||p||_F + lr (beta1 ||m||_F + (1 - beta1) ||g||_F) / ((1 - beta1^t) eps).
// The bounds hold whatever the values; they refuse only steps whose bound comes within 1e-5 of
// float32's largest value (weights or learning rates near 1e38, or AdamW's lr |m| / eps past it),
// where a real run has long diverged.
std::string Muon::Impl::check_weight_range(std::span<const ConstMatrixView> grads,
                                           std::span<const std::uint8_t> active) const {
  struct Bound {
    std::size_t param;
    double decay, lr, adam_scale;  // adam_scale: lr / ((1 - beta1^t) eps); 0 for Muon
    std::size_t first;             // its views' first index: weight, then update or (m, g)
  };
  std::vector<Bound> bounds;
  std::vector<ConstMatrixView> views;
  const AdamWOptions& a = options.adamw;
  const double t = static_cast<double>(step + 1);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamState& p = params[i];
    if (!active.empty() && active[i] == 0) continue;
    const ConstMatrixView w = p.spec.local;
    const Index rows = w.rows - (p.muon ? p.layout.local_pad() : 0);  // padding ignored
    if (p.muon) {
      const double f = options.weight_decay_method == WeightDecayMethod::kDecoupled
                           ? 1.0 - options.lr * options.weight_decay
                       : options.weight_decay_method == WeightDecayMethod::kIndependent
                           ? 1.0 - options.weight_decay
                           : 1.0;
      bounds.push_back({i, options.weight_decay != 0 ? f : 1.0, options.lr, 0, views.size()});
      views.push_back(w.row_block(0, rows));
      views.push_back(p.update.view().row_block(0, rows));
    } else {
      bounds.push_back({i, 1.0 - a.lr * a.weight_decay, a.lr,
                        a.lr / ((1.0 - std::pow(a.beta1, t)) * a.eps), views.size()});
      views.push_back(w);
      views.push_back(p.exp_avg.view());
      views.push_back(grads[i]);
    }
  }
  if (bounds.empty()) return {};
  std::vector<double> sums(views.size());
  try {
    compute->sum_squares(views, true, sums);
  } catch (const Error& e) {
    return e.what();
  }
  const double limit = kMaxFloat32 * (1.0 - 1e-5);  // a margin for float32's roundings
  for (const Bound& b : bounds) {
    const double w = std::sqrt(sums[b.first]);
    const double step_size = b.adam_scale == 0
                                 ? b.lr * std::sqrt(sums[b.first + 1])
                                 : b.adam_scale * (a.beta1 * std::sqrt(sums[b.first + 1]) +
                                                   (1.0 - a.beta1) * std::sqrt(sums[b.first + 2]));
    const double bound = std::abs(b.decay) * w + step_size;
    if (bound <= limit) continue;
    return fmt::format(
        "the step of {} parameter '{}' could take its weights past float32's range: |weights| up "
        "to {:.3g} (Frobenius norm) and a step of up to {:.3g} (learning rate {:g}) against a "
        "largest value of {:.3g}; nothing is updated (lower the learning rate, or check the "
        "weights)",
        b.adam_scale == 0 ? "Muon" : "AdamW", params[b.param].spec.name, w, step_size, b.lr,
        kMaxFloat32);
  }
  return {};
}

}  // namespace distmuon
