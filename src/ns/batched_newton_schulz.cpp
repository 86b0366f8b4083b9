// Batched Newton-Schulz (batched_newton_schulz.h): the batch checked, normalised and staged, then
// the standard and Gram iterations of newton_schulz.cpp and gram_newton_schulz.cpp, written once
// for one matrix and a batch (ns_steps.h, NsViews), run on it.
#include "ns/batched_newton_schulz.h"

#include <fmt/format.h>

#include <utility>
#include <vector>

#include "compute/shape_checks.h"
#include "distmuon/error.h"
#include "ns/gram_newton_schulz.h"

namespace distmuon::detail {

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
    staged = stacked_blocks(w.stage, xs.size(), rows);
    for (std::size_t i = 0; i < xs.size(); ++i)
      compute.copy(xs[i], staged[i]);
  }
  const std::span<const MatrixView> run = staged.empty() ? xs : std::span<const MatrixView>(staged);
  if (gram) {
    gram_iteration(run, xs, opts, compute, *start, w);
  } else {
    standard_iteration(run, xs, opts, compute, *start, w);
  }
}

}  // namespace distmuon::detail
