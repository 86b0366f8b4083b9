// Gram Newton-Schulz: the NS polynomial iterated on s x s matrices only.
//
// With X_0 the normalised s x L input (Gram side s) and the step X <- (a I + b A + c A^2) X,
// A = X X^T, every iterate is X_k = Q_k X_0 where Q_k is a polynomial in G_0 = X_0 X_0^T; all of
// Q_k, R_k = X_k X_k^T = Q_k G_0 Q_k^T and P_k = a I + b R_k + c R_k^2 are polynomials in G_0 and
// commute. So a step needs only
//   P = a I + b R + c R^2   (R^2 by syrk, R symmetric)
//   Q <- P Q                (the first step: Q = P, no product)
//   R <- R P^2              (P^2 by syrk; skipped on the last step)
// and X = Q X_0 is formed once at the end. The s x L products are the Gram matrix G_0 and the
// final product, instead of two per step; with a group, G_0 is the only all-reduced Gram matrix.
// A restart every gram_restart steps forms X = Q X_0, R = X X^T (all-reduced), Q = I, X_0 = X.
//
// For the column side (X = the input's transpose) the same algebra reads G_0 = X_0^T X_0 and
// X = X_0 Q^T, so that the column path is the row path on the transpose, product for product.
#include "ns/gram_newton_schulz.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "distmuon/error.h"
#include "ns/ns_names.h"
#include "ns/ns_steps.h"

namespace distmuon {

NsAlgorithm parse_ns_algorithm(std::string_view name) {
  return detail::parse_enum<NsAlgorithm>(name, "Newton-Schulz algorithm");
}

const char* to_string(NsAlgorithm algorithm) {
  return detail::name_of(algorithm);
}

double gram_growth_limit(Precision precision) {
  switch (precision) {
    case Precision::kTf32:
      return kGramGrowthLimitTf32;
    case Precision::kBf16:
      return kGramGrowthLimitBf16;
    case Precision::kFp32:
      break;
  }
  return kGramGrowthLimit;
}

bool gram_restarts_after(const NsOptions& opts, int step) {
  if (step < 0 || step + 1 >= opts.steps) return false;
  if (opts.gram_restart > 0) return (step + 1) % opts.gram_restart == 0;
  // Automatic: replay the growth of R's rounding errors since the last formation.
  const double limit = gram_growth_limit(opts.precision);
  double growth = 1;
  for (int k = 0; k <= step; ++k) {
    const double a = opts.coefficients.at(k).a;
    growth *= a * a;
    const bool restart = k + 1 < opts.steps && growth > limit;
    if (k == step) return restart;
    if (restart) growth = 1;
  }
  return false;
}

int gram_ns_gram_count(const NsOptions& opts) {
  if (opts.steps < 1) return 0;
  // G_0, and the aol set's input scaling's Gram matrix (ns_steps.h, apply_input_scaling).
  int count = opts.coefficients.input_scaling == CoefficientSet::InputScaling::kAol ? 2 : 1;
  for (int step = 0; step + 1 < opts.steps; ++step)
    count += gram_restarts_after(opts, step) ? 1 : 0;
  return count;
}

namespace detail {
namespace {

// out = Q X_0 (row side) or X_0 Q^T (column side).
void apply_q(Compute& compute, bool rows, Precision precision, NsViews q, NsViews x0, NsViews out) {
  if (rows) {
    multiply(compute, Trans::kNo, Trans::kNo, precision, q, x0, out);
  } else {
    multiply(compute, Trans::kNo, Trans::kYes, precision, x0, q, out);
  }
}

}  // namespace

void gram_iteration(NsViews xs, NsViews out, const NsOptions& opts, Compute& compute,
                    const NsStart& start, NsWorkspace& w) {
  const std::size_t count = xs.size();
  const auto n = static_cast<Index>(count);
  const GramSide side = start.side;
  const bool rows = side == GramSide::kRows;
  const Index s = start.s;
  const Communicator* reduce_over = start.reduce_over;
  for (DeviceMatrix* m : {&w.gram, &w.poly, &w.gram_q, &w.gram_t, &w.gram_u})
    ensure_shape(*m, compute, n * s, s);
  ensure_shape(w.next, compute, n * xs[0].rows, xs[0].cols);
  std::vector<MatrixView> r = stacked_blocks(w.gram, count, s);
  std::vector<MatrixView> p = stacked_blocks(w.poly, count, s);
  std::vector<MatrixView> q = stacked_blocks(w.gram_q, count, s);
  std::vector<MatrixView> t = stacked_blocks(w.gram_t, count, s);
  std::vector<MatrixView> u = stacked_blocks(w.gram_u, count, s);
  for (std::size_t i = 0; i < count; ++i)
    apply_input_scaling(xs[i], opts, compute, start, r[i]);

  std::vector<MatrixView> x0(xs.begin(), xs.end());  // the iterate Q applies to
  std::vector<MatrixView> spare = stacked_blocks(w.next, count, xs[0].rows);  // X = Q X_0
  const Precision precision = opts.precision;
  form_gram(compute, side, opts.use_syrk, precision, x0, r, reduce_over);
  bool q_is_identity = true;
  for (int step = 0; step < opts.steps; ++step) {
    const NsCoefficients& k = opts.coefficients.at(step);
    // P = c R^2 + b R + a I.
    if (k.c != 0.0) {
      // Both terms see one R, as in standard NS (newton_schulz.cpp).
      for (const MatrixView& ri : r)
        compute.round(ri, precision);
      symmetric_square(compute, opts.use_syrk, precision, static_cast<float>(k.c), r, p);
      for (std::size_t i = 0; i < count; ++i)
        compute.axpby(static_cast<float>(k.b), r[i], 1.0f, p[i]);
    } else {
      for (std::size_t i = 0; i < count; ++i)
        compute.axpby(static_cast<float>(k.b), r[i], 0.0f, p[i]);
    }
    for (const MatrixView& pi : p)
      compute.add_diagonal(pi, static_cast<float>(k.a));
    // Q <- P Q. On the first step (or after a restart) Q = P: P's buffer becomes Q's and P's
    // next buffer is the old Q's.
    NsViews p_now = p;
    if (q_is_identity) {
      std::swap(q, p);
      p_now = q;
      q_is_identity = false;
    } else {
      multiply(compute, Trans::kNo, Trans::kNo, precision, p, q, u);
      std::swap(q, u);
    }
    if (step + 1 == opts.steps) break;
    if (gram_restarts_after(opts, step)) {
      apply_q(compute, rows, precision, q, x0, spare);
      std::swap(x0, spare);
      form_gram(compute, side, opts.use_syrk, precision, x0, r, reduce_over);
      q_is_identity = true;
      continue;
    }
    // R <- R P^2 (all commute; P^2 = P P^T since P is symmetric).
    symmetric_square(compute, opts.use_syrk, precision, 1.0f, p_now, t);
    multiply(compute, Trans::kNo, Trans::kNo, precision, r, t, u);
    std::swap(r, u);
  }
  apply_q(compute, rows, precision, q, x0, spare);
  for (std::size_t i = 0; i < count; ++i) {
    if (spare[i].data != out[i].data) compute.copy(spare[i], out[i]);
  }
}

void gram_newton_schulz_inplace(MatrixView x, const NsOptions& opts, Compute& compute,
                                const Communicator* group, NsWorkspace* ws, NormCheck check) {
  const auto start = start_newton_schulz(x, opts, compute, group, "gram newton_schulz", check);
  if (!start) return;
  NsWorkspace local_ws;
  const NsViews one(&x, 1);
  gram_iteration(one, one, opts, compute, *start, ws != nullptr ? *ws : local_ws);
}

double gram_ns_flops(Index m, Index n, const NsOptions& opts) {
  const int steps = opts.steps;
  const bool use_syrk = opts.use_syrk;
  const CoefficientSet& coefficients = opts.coefficients;
  const GramSide side = resolve_side(opts.side, m, n);
  const double s = static_cast<double>(side == GramSide::kRows ? m : n);
  const double l = static_cast<double>(side == GramSide::kRows ? n : m);
  const double sym = use_syrk ? 1.0 : 2.0;  // a symmetric product: half a gemm with syrk
  const double gram = sym * s * s * l, apply = 2.0 * s * s * l;
  double total = gram;  // G_0
  if (coefficients.input_scaling == CoefficientSet::InputScaling::kAol) total += gram;
  bool q_is_identity = true;
  for (int step = 0; step < steps; ++step) {
    if (coefficients.at(step).c != 0.0) total += sym * s * s * s;  // R^2
    if (!q_is_identity) total += 2.0 * s * s * s;                  // P Q
    q_is_identity = false;
    if (step + 1 == steps) break;
    if (gram_restarts_after(opts, step)) {
      total += apply + gram;
      q_is_identity = true;
    } else {
      total += sym * s * s * s + 2.0 * s * s * s;  // P^2, R P^2
    }
  }
  return total + apply;  // X = Q X_0
}

}  // namespace detail
}  // namespace distmuon
