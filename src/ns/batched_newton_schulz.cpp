// Batched Newton-Schulz (batched_newton_schulz.h): the standard and Gram iterations of
// newton_schulz.cpp and gram_newton_schulz.cpp, product for product, on a batch.
#include "ns/batched_newton_schulz.h"

#include <fmt/format.h>

#include <utility>
#include <vector>

#include "compute/shape_checks.h"
#include "distmuon/error.h"
#include "ns/gram_newton_schulz.h"

namespace distmuon::detail {
namespace {

using Views = std::vector<MatrixView>;

// Block i (rows x cols) of a buffer that stacks count such blocks by rows.
Views blocks(DeviceMatrix& m, std::size_t count, Index rows) {
  Views out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i)
    out.push_back(m.view().row_block(static_cast<Index>(i) * rows, rows));
  return out;
}

std::vector<ConstMatrixView> consts(const Views& v) {
  return {v.begin(), v.end()};
}

// form_gram (ns_steps.h) on a batch, locally.
void form_gram_batch(Compute& compute, GramSide side, bool use_syrk, Precision precision,
                     const Views& x, const Views& a) {
  const bool rows = side == GramSide::kRows;
  const Trans t = rows ? Trans::kNo : Trans::kYes;
  const auto xc = consts(x);
  if (use_syrk) {
    compute.syrk_batched(t, 1.0f, xc, 0.0f, a, precision);
  } else {
    compute.gemm_batched(t, rows ? Trans::kYes : Trans::kNo, 1.0f, xc, xc, 0.0f, a, precision);
  }
}

// symmetric_square (ns_steps.h) on a batch.
void symmetric_square_batch(Compute& compute, bool use_syrk, Precision precision, float alpha,
                            const Views& a, const Views& out) {
  const auto ac = consts(a);
  if (use_syrk) {
    compute.syrk_batched(Trans::kNo, alpha, ac, 0.0f, out, precision);
  } else {
    compute.gemm_batched(Trans::kNo, Trans::kNo, alpha, ac, ac, 0.0f, out, precision);
  }
}

// out = Q X_0 (row side) or X_0 Q^T (column side), per matrix, one batched product.
void apply_q_batch(Compute& compute, bool rows, Precision precision, const Views& q,
                   const Views& x0, const Views& out) {
  if (rows) {
    compute.gemm_batched(Trans::kNo, Trans::kNo, 1.0f, consts(q), consts(x0), 0.0f, out, precision);
  } else {
    compute.gemm_batched(Trans::kNo, Trans::kYes, 1.0f, consts(x0), consts(q), 0.0f, out,
                         precision);
  }
}

// Each takes the batch xs and leaves the results in out (xs itself, or the matrices xs were
// staged from: the last iterate copied there once).
void standard_batch(std::span<const MatrixView> xs, std::span<const MatrixView> out,
                    const NsOptions& opts, Compute& compute, const NsStart& start, NsWorkspace& w) {
  const std::size_t count = xs.size();
  const GramSide side = start.side;
  const Index s = start.s, rows = xs[0].rows, cols = xs[0].cols;
  if (opts.precision == Precision::kBf16) {
    std::vector<NsStep> steps(static_cast<std::size_t>(opts.steps));
    for (int step = 0; step < opts.steps; ++step) {
      const NsCoefficients& k = opts.coefficients.at(step);
      steps[static_cast<std::size_t>(step)] = {static_cast<float>(k.a), static_cast<float>(k.b),
                                               static_cast<float>(k.c)};
    }
    const bool on_rows = side == GramSide::kRows;
    ensure_shape(w.bf16, compute, 1,
                 ns_bf16_scratch_floats(static_cast<Index>(count), rows, cols, on_rows));
    compute.newton_schulz_bf16(xs, on_rows, steps, opts.use_syrk, w.bf16.view());
    return;
  }
  const auto n = static_cast<Index>(count);
  ensure_shape(w.gram, compute, n * s, s);
  ensure_shape(w.next, compute, n * rows, cols);
  Views a = blocks(w.gram, count, s);
  for (std::size_t i = 0; i < count; ++i)
    apply_input_scaling(xs[i], opts, compute, start, a[i]);
  Views cur(xs.begin(), xs.end());
  Views nxt = blocks(w.next, count, rows);
  Views poly;
  for (int step = 0; step < opts.steps; ++step) {
    const NsCoefficients& k = opts.coefficients.at(step);
    form_gram_batch(compute, side, opts.use_syrk, opts.precision, cur, a);
    Views* b = &a;
    if (k.c != 0.0) {
      for (const MatrixView& ai : a)
        compute.round(ai, opts.precision);
      if (poly.empty()) {
        ensure_shape(w.poly, compute, n * s, s);
        poly = blocks(w.poly, count, s);
      }
      symmetric_square_batch(compute, opts.use_syrk, opts.precision, static_cast<float>(k.c), a,
                             poly);
      for (std::size_t i = 0; i < count; ++i)
        compute.ns_polynomial(static_cast<float>(k.a), static_cast<float>(k.b), a[i], poly[i]);
      b = &poly;
    } else {
      for (const MatrixView& ai : a) {
        compute.scale(ai, static_cast<float>(k.b));
        compute.add_diagonal(ai, static_cast<float>(k.a));
      }
    }
    if (side == GramSide::kRows) {
      compute.gemm_batched(Trans::kNo, Trans::kNo, 1.0f, consts(*b), consts(cur), 0.0f, nxt,
                           opts.precision);
    } else {
      compute.gemm_batched(Trans::kNo, Trans::kNo, 1.0f, consts(cur), consts(*b), 0.0f, nxt,
                           opts.precision);
    }
    std::swap(cur, nxt);
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (cur[i].data != out[i].data) compute.copy(cur[i], out[i]);
  }
}

void gram_batch(std::span<const MatrixView> xs, std::span<const MatrixView> out,
                const NsOptions& opts, Compute& compute, const NsStart& start, NsWorkspace& w) {
  const std::size_t count = xs.size();
  const auto n = static_cast<Index>(count);
  const GramSide side = start.side;
  const bool rows = side == GramSide::kRows;
  const Index s = start.s;
  for (DeviceMatrix* m : {&w.gram, &w.poly, &w.gram_q, &w.gram_t, &w.gram_u})
    ensure_shape(*m, compute, n * s, s);
  ensure_shape(w.next, compute, n * xs[0].rows, xs[0].cols);
  Views r = blocks(w.gram, count, s), p = blocks(w.poly, count, s), q = blocks(w.gram_q, count, s);
  Views t = blocks(w.gram_t, count, s), u = blocks(w.gram_u, count, s);
  for (std::size_t i = 0; i < count; ++i)
    apply_input_scaling(xs[i], opts, compute, start, r[i]);
  Views x0(xs.begin(), xs.end());
  Views spare = blocks(w.next, count, xs[0].rows);
  const Precision precision = opts.precision;
  form_gram_batch(compute, side, opts.use_syrk, precision, x0, r);
  bool q_is_identity = true;
  for (int step = 0; step < opts.steps; ++step) {
    const NsCoefficients& k = opts.coefficients.at(step);
    if (k.c != 0.0) {
      for (const MatrixView& ri : r)
        compute.round(ri, precision);
      symmetric_square_batch(compute, opts.use_syrk, precision, static_cast<float>(k.c), r, p);
      for (std::size_t i = 0; i < count; ++i)
        compute.axpby(static_cast<float>(k.b), r[i], 1.0f, p[i]);
    } else {
      for (std::size_t i = 0; i < count; ++i)
        compute.axpby(static_cast<float>(k.b), r[i], 0.0f, p[i]);
    }
    for (const MatrixView& pi : p)
      compute.add_diagonal(pi, static_cast<float>(k.a));
    Views* p_now = &p;
    if (q_is_identity) {
      std::swap(q, p);
      p_now = &q;
      q_is_identity = false;
    } else {
      compute.gemm_batched(Trans::kNo, Trans::kNo, 1.0f, consts(p), consts(q), 0.0f, u, precision);
      std::swap(q, u);
    }
    if (step + 1 == opts.steps) break;
    if (gram_restarts_after(opts, step)) {
      apply_q_batch(compute, rows, precision, q, x0, spare);
      std::swap(x0, spare);
      form_gram_batch(compute, side, opts.use_syrk, precision, x0, r);
      q_is_identity = true;
      continue;
    }
    symmetric_square_batch(compute, opts.use_syrk, precision, 1.0f, *p_now, t);
    compute.gemm_batched(Trans::kNo, Trans::kNo, 1.0f, consts(r), consts(t), 0.0f, u, precision);
    std::swap(r, u);
  }
  apply_q_batch(compute, rows, precision, q, x0, spare);
  for (std::size_t i = 0; i < count; ++i) {
    if (spare[i].data != out[i].data) compute.copy(spare[i], out[i]);
  }
}

}  // namespace

void run_newton_schulz_batch(std::span<const MatrixView> xs, const NsOptions& opts,
                             Compute& compute, NsWorkspace* ws, NormCheck check) {
  for (const MatrixView& x : xs) {
    if (x.rows != xs[0].rows || x.cols != xs[0].cols) {
      throw Error(fmt::format("batched newton_schulz: matrices of shapes {} and {} in one batch",
                              shape_str(xs[0]), shape_str(x)));
    }
  }
  if (xs.size() <= 1) {
    if (!xs.empty()) run_newton_schulz(xs[0], opts, compute, nullptr, ws, check);
    return;
  }
  const bool gram = opts.algorithm == NsAlgorithm::kGram;
  std::optional<NsStart> start;
  for (const MatrixView& x : xs) {
    start = start_newton_schulz(x, opts, compute, nullptr,
                                gram ? "gram newton_schulz" : "newton_schulz", check);
    if (!start) return;  // empty matrices: nothing to orthogonalise
  }
  NsWorkspace local_ws;
  NsWorkspace& w = ws != nullptr ? *ws : local_ws;
  // Scattered matrices (separate weights of one shape, not one stacked parameter's slices) are
  // copied into one equally strided buffer and back, so that a backend that multiplies equally
  // strided batches as one product (cuda's strided-batched GEMM; any other batch it runs product
  // by product) gets every product of the batch as one; the copies are exact. bf16 storage
  // stages the batch in its own scratch (Compute::newton_schulz_bf16).
  const bool own_scratch = !gram && opts.precision == Precision::kBf16;
  std::vector<MatrixView> staged;
  if (!own_scratch && !batch_stride(std::vector<ConstMatrixView>(xs.begin(), xs.end()))) {
    const Index rows = xs[0].rows;
    ensure_shape(w.stage, compute, static_cast<Index>(xs.size()) * rows, xs[0].cols);
    staged = blocks(w.stage, xs.size(), rows);
    for (std::size_t i = 0; i < xs.size(); ++i)
      compute.copy(xs[i], staged[i]);
  }
  const std::span<const MatrixView> run = staged.empty() ? xs : std::span<const MatrixView>(staged);
  if (gram) {
    gram_batch(run, xs, opts, compute, *start, w);
  } else {
    standard_batch(run, xs, opts, compute, *start, w);
  }
}

}  // namespace distmuon::detail
