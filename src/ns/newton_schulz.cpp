#include "distmuon/newton_schulz.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "distmuon/error.h"
#include "ns/gram_newton_schulz.h"
#include "ns/ns_steps.h"

namespace distmuon {
namespace detail {

void standard_iteration(NsViews xs, NsViews out, const NsOptions& opts, Compute& compute,
                        const NsStart& start, NsWorkspace& w) {
  const std::size_t count = xs.size();
  const auto n = static_cast<Index>(count);
  const GramSide side = start.side;
  const Index s = start.s, rows = xs[0].rows, cols = xs[0].cols;
  if (opts.precision == Precision::kBf16 && start.reduce_over == nullptr) {
    // Local bf16: the iterate stored in bf16 across the steps, each product writing bf16 with
    // the polynomial in its epilogue (Compute::newton_schulz_bf16: one call for the whole
    // iteration of the whole batch; docs/precision.md, "bf16 storage").
    std::vector<NsStep> steps(static_cast<std::size_t>(opts.steps));
    for (int step = 0; step < opts.steps; ++step) {
      const NsCoefficients& k = opts.coefficients.at(step);
      steps[static_cast<std::size_t>(step)] = {static_cast<float>(k.a), static_cast<float>(k.b),
                                               static_cast<float>(k.c)};
    }
    const bool on_rows = side == GramSide::kRows;
    ensure_shape(w.bf16, compute, 1, ns_bf16_scratch_floats(n, rows, cols, on_rows));
    compute.newton_schulz_bf16(xs, on_rows, steps, opts.use_syrk, w.bf16.view());
    return;
  }
  ensure_shape(w.gram, compute, n * s, s);
  ensure_shape(w.next, compute, n * rows, cols);
  const std::vector<MatrixView> a = stacked_blocks(w.gram, count, s);
  for (std::size_t i = 0; i < count; ++i)
    apply_input_scaling(xs[i], opts, compute, start, a[i]);

  std::vector<MatrixView> cur(xs.begin(), xs.end());
  std::vector<MatrixView> nxt = stacked_blocks(w.next, count, rows);
  std::vector<MatrixView> poly;
  for (int step = 0; step < opts.steps; ++step) {
    const NsCoefficients& k = opts.coefficients.at(step);
    form_gram(compute, side, opts.use_syrk, opts.precision, cur, a, start.reduce_over);
    // B = c A A + b A + a I, so that the update a X + (b A + c A A) X is one product B X.
    NsViews b = a;
    if (k.c != 0.0) {
      // At a reduced precision A is rounded first, so that b A and c A A see the same matrix:
      // the polynomial is flat near its fixed point, so a consistently rounded A barely moves B,
      // while A rounded in one term only does (half the error in bf16; docs/precision.md).
      for (const MatrixView& ai : a)
        compute.round(ai, opts.precision);
      if (poly.empty()) {
        ensure_shape(w.poly, compute, n * s, s);
        poly = stacked_blocks(w.poly, count, s);
      }
      symmetric_square(compute, opts.use_syrk, opts.precision, static_cast<float>(k.c), a, poly);
      // (b A + c A A) + a I: one fused pass on the GPU, the same rounding everywhere.
      for (std::size_t i = 0; i < count; ++i)
        compute.ns_polynomial(static_cast<float>(k.a), static_cast<float>(k.b), a[i], poly[i]);
      b = poly;
    } else {
      for (const MatrixView& ai : a) {
        compute.scale(ai, static_cast<float>(k.b));
        compute.add_diagonal(ai, static_cast<float>(k.a));
      }
    }
    if (side == GramSide::kRows) {
      multiply(compute, Trans::kNo, Trans::kNo, opts.precision, b, cur, nxt);
    } else {
      multiply(compute, Trans::kNo, Trans::kNo, opts.precision, cur, b, nxt);
    }
    std::swap(cur, nxt);
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (cur[i].data != out[i].data) compute.copy(cur[i], out[i]);
  }
}

void run_newton_schulz(MatrixView x, const NsOptions& opts, Compute& compute,
                       const Communicator* group, NsWorkspace* ws, NormCheck check) {
  if (opts.algorithm == NsAlgorithm::kGram) {
    gram_newton_schulz_inplace(x, opts, compute, group, ws, check);
    return;
  }
  const auto start = start_newton_schulz(x, opts, compute, group, "newton_schulz", check);
  if (!start) return;
  NsWorkspace local_ws;
  const NsViews one(&x, 1);
  standard_iteration(one, one, opts, compute, *start, ws != nullptr ? *ws : local_ws);
}

}  // namespace detail

void newton_schulz_inplace(MatrixView x, const NsOptions& opts, Compute& compute,
                           const Communicator* group, NsWorkspace* ws) {
  // A standalone call checks its input's norm on the host (one wait on a device backend), so a
  // non-finite input is refused before the iteration on every backend, as on the CPU.
  detail::run_newton_schulz(x, opts, compute, group, ws, detail::NormCheck::kHost);
}

Matrix newton_schulz(ConstMatrixView g, const NsOptions& opts, Compute& compute) {
  DeviceMatrix x = to_device(compute, g);
  newton_schulz_inplace(x.view(), opts, compute);
  // A guard: a finite input was checked and the schedule too (NsOptions::validate), which keeps
  // the result finite; a device backend turns a non-finite input into NaN instead of refusing it.
  if (const auto at = compute.find_non_finite(x.view())) {
    throw Error(fmt::format(
        "newton_schulz: the result of a {} input is not finite at ({}, {}) on the {} backend (a "
        "non-finite input, or a norm that overflows); nothing is returned",
        shape_str(g), at->row, at->col, compute.name()));
  }
  return to_host(compute, x.view());
}

double ns_flops(Index m, Index n, int steps, bool use_syrk, GramSide side,
                const CoefficientSet* coefficients) {
  const GramSide sd = detail::resolve_side(side, m, n);
  const double s = static_cast<double>(sd == GramSide::kRows ? m : n);
  const double l = static_cast<double>(sd == GramSide::kRows ? n : m);
  const double gram = use_syrk ? 1.0 : 2.0;
  // The aol set's input scaling forms one more Gram matrix (ns_steps.h, apply_input_scaling).
  const bool aol =
      coefficients != nullptr && coefficients->input_scaling == CoefficientSet::InputScaling::kAol;
  double total = aol ? gram * s * s * l : 0.0;
  for (int step = 0; step < steps; ++step) {
    const bool cubic = coefficients != nullptr && coefficients->at(step).c == 0.0;
    total += gram * s * s * l + (cubic ? 0.0 : gram * s * s * s) + 2.0 * s * s * l;
  }
  return total;
}

double ns_flops(Index m, Index n, const NsOptions& opts) {
  if (opts.algorithm == NsAlgorithm::kGram) {
    return detail::gram_ns_flops(m, n, opts);
  }
  return ns_flops(m, n, opts.steps, opts.use_syrk, opts.side, &opts.coefficients);
}

double ns_gemm_flops(Index m, Index n, int steps) {
  const double s = static_cast<double>(std::min(m, n));
  const double l = static_cast<double>(std::max(m, n));
  return steps * (4.0 * s * s * l + 2.0 * s * s * s);
}

double ns_workspace_bytes(Index m, Index n) {
  const double s = static_cast<double>(std::min(m, n));
  // The bf16 scratch (ns_bf16_scratch_floats: 2 s^2 + m n + 48) fits in this but for s < 4.
  return sizeof(float) * (5.0 * s * s + static_cast<double>(m) * static_cast<double>(n) + 48.0);
}

}  // namespace distmuon
