#pragma once
// The pieces both Newton-Schulz algorithms (standard: newton_schulz.cpp, Gram:
// gram_newton_schulz.cpp) are built from: the prologue (checks, Gram side, normalisation), the
// Gram matrix of an iterate, the square of a symmetric matrix and the other products, each on one
// matrix or on a batch of equal shapes (batched_newton_schulz.h).

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"

namespace distmuon::detail {

// kAuto: the smaller side of a rows x cols matrix (rows on a tie).
GramSide resolve_side(GramSide side, Index rows, Index cols);
// Sizes a workspace member (no allocation when the shape and backend are unchanged).
inline void ensure_shape(DeviceMatrix& m, Compute& compute, Index rows, Index cols) {
  m.ensure(compute, rows, cols);
}

// What the prologue found: the Gram side, the Gram matrix's size s, and the group to all-reduce
// over (nullptr when local or a group of one).
// Where the prologue's norm is checked: kHost reads it on the host and refuses a non-finite
// input before the iteration (one wait on a device backend: the public newton_schulz calls);
// kBackend lets a device backend keep it in its memory (Compute::normalize), a non-finite input
// then leaving x NaN for the caller's batched check (the optimizer's step); on the cpu, which
// reads the norm on the host either way, kBackend fills x with NaN too instead of throwing.
enum class NormCheck { kHost, kBackend };

struct NsStart {
  GramSide side = GramSide::kRows;
  Index s = 0;
  const Communicator* reduce_over = nullptr;
};

// The prologue of both algorithms: validates opts, refuses a group without an explicit Gram
// side (a shard's shape does not tell the global orientation), and normalises x in place by its
// Frobenius norm (global: one all-reduce of a double over the group) with Compute::normalize.
// kHost throws distmuon::Error, prefixed by name, on a non-finite input; kBackend (every backend)
// makes x NaN instead and the caller checks the result. nullopt for an empty x: nothing to
// orthogonalise.
std::optional<NsStart> start_newton_schulz(MatrixView x, const NsOptions& opts, Compute& compute,
                                           const Communicator* group, std::string_view name,
                                           NormCheck check);

// The aol set's input scaling after the prologue (CoefficientSet::InputScaling::kAol; nothing
// for every other set): gram (s x s scratch) = X X^T on start's side in fp32, summed over
// start.reduce_over, read on the host (one s x s transfer), and row i of X (column i when the
// side is kCols) multiplied by float(1 / sqrt(sum_j |gram_ij|)), each in fp32 (Compute::scale).
// A zero row is left zero; a non-finite Gram matrix (a poisoned x) leaves x NaN.
void apply_input_scaling(MatrixView x, const NsOptions& opts, Compute& compute,
                         const NsStart& start, MatrixView gram);

// newton_schulz_inplace with the norm checked where `check` says (the public call: kHost; the
// optimizer's sharded path: kBackend, a non-finite input then leaving x NaN, unreported).
void run_newton_schulz(MatrixView x, const NsOptions& opts, Compute& compute,
                       const Communicator* group, NsWorkspace* ws, NormCheck check);

// The matrices an NS product works on: one matrix (the single-matrix path: Compute's plain
// products, a Gram matrix summed over the group) or a local batch of equal shapes, one view per
// matrix (batched_newton_schulz.h: Compute's batched products, one call for the whole batch).
// Both iterations are written once over them (standard_iteration, gram_iteration), so that a
// matrix of a batch gets the operations its own run gets, in the same order.
using NsViews = std::span<const MatrixView>;

// count blocks of rows x m.cols stacked by rows in m (a batch's workspace; m itself for one).
std::vector<MatrixView> stacked_blocks(DeviceMatrix& m, std::size_t count, Index rows);

// a = x x^T (kRows) or x^T x (kCols), full symmetric, by syrk or gemm at `precision`; summed over
// group's data plane when group is not null (one matrix only: a batch is local).
void form_gram(Compute& compute, GramSide side, bool use_syrk, Precision precision, NsViews x,
               NsViews a, const Communicator* group);

// out = alpha a a^T for a symmetric s x s a (that is, alpha a^2), by syrk or gemm at `precision`.
void symmetric_square(Compute& compute, bool use_syrk, Precision precision, float alpha, NsViews a,
                      NsViews out);

// out = op(a) op(b) at `precision`, by gemm.
void multiply(Compute& compute, Trans ta, Trans tb, Precision precision, NsViews a, NsViews b,
              NsViews out);

// The standard iteration after the prologue (start_newton_schulz; the bf16 storage path when
// local) on xs: one matrix (reduced over start.reduce_over) or a local batch. Its results are
// left in out: xs itself, or the matrices xs were staged from (the last iterate copied there).
void standard_iteration(NsViews xs, NsViews out, const NsOptions& opts, Compute& compute,
                        const NsStart& start, NsWorkspace& w);

}  // namespace distmuon::detail
