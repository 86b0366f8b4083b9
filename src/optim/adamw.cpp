#include "distmuon/adamw.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "distmuon/error.h"

namespace distmuon {

void AdamWOptions::validate() const {
  auto check = [](bool ok, const char* field, double value, const std::string& valid) {
    if (!ok)
      throw Error(fmt::format("AdamW option {} = {} is invalid; valid: {}", field, value, valid));
  };
  // Every setting is used as a float32 factor: a finite double past float32's range (1e39) would
  // write infinities into the weights.
  const auto f32 = [](double v) { return std::isfinite(v) && std::abs(v) <= kMaxFloat32; };
  const std::string in_range =
      fmt::format("a number >= 0 and <= {:g} (float32's range)", kMaxFloat32);
  check(f32(lr) && lr >= 0, "lr", lr, in_range);
  check(beta1 >= 0 && beta1 < 1, "beta1", beta1, "0 <= beta1 < 1");
  check(beta2 >= 0 && beta2 < 1, "beta2", beta2, "0 <= beta2 < 1");
  check(f32(eps) && eps > 0, "eps", eps,
        fmt::format("a number > 0 and <= {:g} (float32's range)", kMaxFloat32));
  check(f32(weight_decay) && weight_decay >= 0, "weight_decay", weight_decay, in_range);
  check(f32(1.0 - lr * weight_decay), "weight_decay", weight_decay,
        fmt::format("a decay factor 1 - lr x weight_decay within float32's range ({:g})",
                    kMaxFloat32));
}

std::optional<AdamWOverflow> adamw_overflow(std::span<const ConstMatrixView> grads,
                                            std::span<const ConstMatrixView> exp_avg_sq,
                                            const AdamWOptions& o, Compute& compute) {
  DISTMUON_ASSERT(grads.size() == exp_avg_sq.size(), "one second moment per gradient");
  if (grads.empty()) return std::nullopt;
  const std::size_t n = grads.size();
  std::vector<ConstMatrixView> views(grads.begin(), grads.end());
  views.insert(views.end(), exp_avg_sq.begin(), exp_avg_sq.end());
  std::vector<double> sums(2 * n);
  compute.sum_squares(views, true, sums);
  return adamw_overflow(grads, exp_avg_sq, std::span(sums).first(n), std::span(sums).subspan(n), o,
                        compute);
}

std::optional<AdamWOverflow> adamw_overflow(std::span<const ConstMatrixView> grads,
                                            std::span<const ConstMatrixView> exp_avg_sq,
                                            std::span<const double> grad_sums,
                                            std::span<const double> exp_avg_sq_sums,
                                            const AdamWOptions& o, Compute& compute) {
  DISTMUON_ASSERT(grads.size() == exp_avg_sq.size() && grad_sums.size() == grads.size() &&
                      exp_avg_sq_sums.size() == grads.size(),
                  "one second moment and one sum per gradient");
  const std::size_t n = grads.size();
  const double b2 = o.beta2, limit = kMaxFloat32 * (1.0 - 1e-6);
  for (std::size_t i = 0; i < n; ++i) {
    if (b2 * std::sqrt(exp_avg_sq_sums[i]) + (1.0 - b2) * grad_sums[i] <= limit)
      continue;  // every element
    const Matrix g = to_host(compute, grads[i]), v = to_host(compute, exp_avg_sq[i]);
    for (Index r = 0; r < g.rows(); ++r) {
      for (Index c = 0; c < g.cols(); ++c) {
        const double gv = g(r, c);
        if (!(b2 * v(r, c) + (1.0 - b2) * gv * gv <= limit))
          return AdamWOverflow{i, {r, c}, g(r, c)};
      }
    }
  }
  return std::nullopt;
}

void adamw_update(MatrixView p, ConstMatrixView g, MatrixView exp_avg, MatrixView exp_avg_sq,
                  std::int64_t step, const AdamWOptions& o, Compute& compute) {
  auto same = [&](Index r, Index c) { return r == p.rows && c == p.cols; };
  if (!same(g.rows, g.cols) || !same(exp_avg.rows, exp_avg.cols) ||
      !same(exp_avg_sq.rows, exp_avg_sq.cols)) {
    throw Error(fmt::format("adamw_update: shapes differ (param {}, grad {}, moments {} and {})",
                            shape_str(p), shape_str(g), shape_str(exp_avg), shape_str(exp_avg_sq)));
  }
  if (step < 1) throw Error(fmt::format("adamw_update: step must be >= 1, got {}", step));
  const double t = static_cast<double>(step);
  AdamWStep k;
  k.beta1 = static_cast<float>(o.beta1);
  k.beta2 = static_cast<float>(o.beta2);
  k.bias1 = static_cast<float>(1.0 - std::pow(o.beta1, t));
  k.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, t)));
  k.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  k.lr = static_cast<float>(o.lr);
  k.eps = static_cast<float>(o.eps);
  compute.adamw(k, g, exp_avg, exp_avg_sq, p);
}

}  // namespace distmuon
