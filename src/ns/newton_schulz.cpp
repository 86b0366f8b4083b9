#include "distmuon/newton_schulz.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "distmuon/error.h"
#include "ns/gram_newton_schulz.h"

namespace distmuon {
namespace {

GramSide resolve_side(GramSide side, Index rows, Index cols) {
  if (side != GramSide::kAuto) return side;
  return rows <= cols ? GramSide::kRows : GramSide::kCols;
}

void ensure_shape(Matrix& m, Index rows, Index cols) {
  if (m.rows() != rows || m.cols() != cols) m = Matrix(rows, cols);
}

// A = X X^T (kRows) or X^T X (kCols), full symmetric.
void gram(Compute& compute, GramSide side, bool use_syrk, ConstMatrixView x, MatrixView a) {
  const Trans t = side == GramSide::kRows ? Trans::kNo : Trans::kYes;
  if (use_syrk) {
    compute.syrk(t, 1.0f, x, 0.0f, a);
  } else if (side == GramSide::kRows) {
    compute.gemm(Trans::kNo, Trans::kYes, 1.0f, x, x, 0.0f, a);
  } else {
    compute.gemm(Trans::kYes, Trans::kNo, 1.0f, x, x, 0.0f, a);
  }
}

}  // namespace

void newton_schulz_inplace(MatrixView x, const NsOptions& opts, Compute& compute,
                           const Communicator* group, NsWorkspace* ws) {
  if (opts.algorithm == NsAlgorithm::kGram) {
    detail::gram_newton_schulz_inplace(x, opts, compute, group, ws);
    return;
  }
  opts.validate();
  const bool distributed = group != nullptr && group->size() > 1;
  if (distributed && opts.side == GramSide::kAuto) {
    throw Error(
        "newton_schulz over a group needs an explicit Gram side (the local shard's shape does not "
        "tell the global orientation)");
  }
  if (x.size() == 0) return;
  const GramSide side = resolve_side(opts.side, x.rows, x.cols);
  const Index s = side == GramSide::kRows ? x.rows : x.cols;

  NsWorkspace local_ws;
  NsWorkspace& w = ws != nullptr ? *ws : local_ws;
  ensure_shape(w.gram, s, s);
  ensure_shape(w.next, x.rows, x.cols);

  // Normalise by the (global) Frobenius norm.
  double ss = compute.sum_squares(x, opts.norm_in_double);
  if (distributed) ss = group->all_reduce(ss);
  if (!std::isfinite(ss)) {
    throw Error(
        fmt::format("newton_schulz: input {}{} contains non-finite values (or its norm overflows)",
                    shape_str(x), distributed ? fmt::format(" (rank {})", group->rank()) : ""));
  }
  compute.scale(x, static_cast<float>(1.0 / std::max(std::sqrt(ss), opts.eps)));

  MatrixView cur = x;
  MatrixView nxt = w.next.view();
  MatrixView a = w.gram.view();
  for (int step = 0; step < opts.steps; ++step) {
    const NsCoefficients& k = opts.coefficients.at(step);
    gram(compute, side, opts.use_syrk, cur, a);
    if (distributed)
      group->all_reduce(std::span<float>(a.data, static_cast<std::size_t>(a.size())));
    // B = c A A + b A + a I, so that the update a X + (b A + c A A) X is one product B X.
    MatrixView b = a;
    if (k.c != 0.0) {
      ensure_shape(w.poly, s, s);
      b = w.poly.view();
      if (opts.use_syrk) {
        compute.syrk(Trans::kNo, static_cast<float>(k.c), a, 0.0f, b);  // A symmetric: A A^T = A A
      } else {
        compute.gemm(Trans::kNo, Trans::kNo, static_cast<float>(k.c), a, a, 0.0f, b);
      }
      compute.axpby(static_cast<float>(k.b), a, 1.0f, b);
    } else {
      compute.scale(b, static_cast<float>(k.b));
    }
    compute.add_diagonal(b, static_cast<float>(k.a));
    if (side == GramSide::kRows) {
      compute.gemm(Trans::kNo, Trans::kNo, 1.0f, b, cur, 0.0f, nxt);
    } else {
      compute.gemm(Trans::kNo, Trans::kNo, 1.0f, cur, b, 0.0f, nxt);
    }
    std::swap(cur, nxt);
  }
  if (cur.data != x.data) compute.copy(cur, x);
}

Matrix newton_schulz(ConstMatrixView g, const NsOptions& opts, Compute& compute) {
  Matrix out(g.rows, g.cols);
  compute.copy(g, out.view());
  newton_schulz_inplace(out.view(), opts, compute);
  return out;
}

double ns_flops(Index m, Index n, int steps, bool use_syrk, GramSide side,
                const CoefficientSet* coefficients) {
  const GramSide sd = resolve_side(side, m, n);
  const double s = static_cast<double>(sd == GramSide::kRows ? m : n);
  const double l = static_cast<double>(sd == GramSide::kRows ? n : m);
  const double gram = use_syrk ? 1.0 : 2.0;
  double total = 0;
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
  return sizeof(float) * (5.0 * s * s + static_cast<double>(m) * static_cast<double>(n));
}

}  // namespace distmuon
