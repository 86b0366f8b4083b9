#pragma once
// Gram Newton-Schulz (NsAlgorithm::kGram), reached through newton_schulz_inplace and ns_flops.

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "ns/ns_steps.h"

namespace distmuon::detail {

// The norm is checked as `check` says (ns_steps.h).
void gram_newton_schulz_inplace(MatrixView x, const NsOptions& opts, Compute& compute,
                                const Communicator* group, NsWorkspace* ws, NormCheck check);

// The Gram iteration after the prologue (start_newton_schulz) on xs: one matrix (its Gram
// matrices reduced over start.reduce_over) or a local batch (ns_steps.h, NsViews). Its results
// are left in out: xs itself, or the matrices xs were staged from (X = Q X_0 copied there).
void gram_iteration(NsViews xs, NsViews out, const NsOptions& opts, Compute& compute,
                    const NsStart& start, NsWorkspace& w);

double gram_ns_flops(Index m, Index n, const NsOptions& opts);

}  // namespace distmuon::detail
