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

double gram_ns_flops(Index m, Index n, const NsOptions& opts);

}  // namespace distmuon::detail
