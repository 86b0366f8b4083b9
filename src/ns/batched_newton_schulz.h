#pragma once
// Newton-Schulz on a batch of equal-shaped matrices (the slices of a batched parameter, e.g. a
// layer's experts; the equal-shaped weights a rank orthogonalises locally): every NS product of
// a step is one batched call for the whole batch (Compute::gemm_batched / syrk_batched; at bf16
// one Compute::newton_schulz_bf16 call), the elementwise passes (normalisation, rounding, the
// polynomial) run per matrix. Each matrix gets exactly the operations, in the same order, that
// its own local run_newton_schulz gives it: on the cpu and opaque backends the same bits.

#include <span>

#include "distmuon/compute.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "ns/ns_steps.h"

namespace distmuon::detail {

// Orthogonalises each xs[i] in place, locally (no group), with opts (either algorithm, any
// precision), the norm checked as `check` says (ns_steps.h). Every xs[i] has xs[0]'s shape
// (else distmuon::Error). ws: scratch for the batch (NsWorkspaces::batch: its matrices stack one
// s x s block per matrix, so that a batch is equally strided), allocated for the call when null.
// A batch of one is run_newton_schulz.
void run_newton_schulz_batch(std::span<const MatrixView> xs, const NsOptions& opts,
                             Compute& compute, NsWorkspace* ws, NormCheck check);

}  // namespace distmuon::detail
