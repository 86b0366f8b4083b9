#pragma once
// The duplicated work matrix of a sharded weight and its orthogonalisation (internal: duplicated
// mode and owner mode share it). The layout and the per-mode dispatcher are public (layout.h).

#include <span>

#include "distmuon/compute.h"
#include "distmuon/layout.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "ns/ns_workspaces.h"

namespace distmuon::detail {

using distmuon::orthogonalize_shard;
using distmuon::ScaleFn;
using distmuon::ShardLayout;

// The work matrix duplicated mode gathers for a weight: every TP rank's TP-local (padded) tensor,
// stacked by rows for tp_dim 0 ((tp_size * padded_rows) x n), side by side for tp_dim 1
// (padded_rows x n), the TP-local tensor itself without TP. full_work_rows/cols give its shape.
Index full_work_rows(const ShardLayout& layout);
Index full_work_cols(const ShardLayout& layout);
// Orthogonalises and scales that full work matrix in place, per row class, zeroing padding rows:
// exactly what duplicated mode runs on it (owner mode runs the same code on the owner rank).
// NS scratch and the class-row buffers come from workspaces (kept across steps).
void orthogonalize_full(MatrixView full, const ShardLayout& layout, const NsOptions& ns,
                        const ScaleFn& scale, Compute& compute, NsWorkspaces& workspaces);

// orthogonalize_full on several full work matrices: those of equal layouts and algorithm (the
// slices of a batched parameter, equal-shaped weights) together, each NS product one batched
// call (run_newton_schulz_batch); each matrix gets orthogonalize_full's bits. ns's algorithm is
// replaced by each work's.
struct FullWork {
  MatrixView full;
  const ShardLayout* layout = nullptr;
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
};
void orthogonalize_fulls(std::span<const FullWork> works, const NsOptions& ns, const ScaleFn& scale,
                         Compute& compute, NsWorkspaces& workspaces);

// orthogonalize_shard on several shards of one layout (a batched parameter's slices), each with
// its bits: blockwise (or unsharded) as one local batch; duplicated gathering the whole batch in
// one collective per group (gather_batch_into: GTP, then TP), then the full matrices as one
// batch; distributed one shard after the other.
void orthogonalize_shards(std::span<const MatrixView> us, const ShardLayout& layout,
                          const Communicator& tp, const Communicator& gtp, TpMode mode,
                          const NsOptions& ns, const ScaleFn& scale, Compute& compute,
                          NsWorkspaces& workspaces);

// orthogonalize_shard (layout.h) with the caller's NS scratch and gathered buffers, kept across
// calls (the optimizer's, the model benchmark's): no allocation once every shape has been seen.
// workspaces null: buffers allocated for this call (what the public overload does).
void orthogonalize_shard(MatrixView u, const ShardLayout& layout, const Communicator& tp,
                         const Communicator& gtp, TpMode mode, const NsOptions& ns,
                         const ScaleFn& scale, Compute& compute, NsWorkspaces* workspaces);

// All-gathers this rank's equal shard along dim (0: rows, 1: columns) over group.data() into
// full (compute's memory, contiguous, the gathered shape), the column interleave's staging from
// workspaces.
void gather_shards_into(ConstMatrixView shard, int dim, const Communicator& group, Compute& compute,
                        NsWorkspaces& workspaces, MatrixView full);
// gather_shards_into for a batch of equal shards (a batched parameter's matrices) in one
// all-gather: fulls[i] gets exactly what gather_shards_into(shards[i], ...) gives it. The shards
// are sent as they lie when back to back (else staged so); what arrives is copied into place.
void gather_batch_into(std::span<const MatrixView> shards, int dim, const Communicator& group,
                       Compute& compute, NsWorkspaces& workspaces,
                       std::span<const MatrixView> fulls);

}  // namespace distmuon::detail
