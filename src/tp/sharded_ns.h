#pragma once
// The duplicated work matrix of a sharded weight and its orthogonalisation (internal: duplicated
// mode and owner mode share it). The layout and the per-mode dispatcher are public (layout.h).

#include <cstddef>
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

// Whether two layouts give their matrices the same NS work (the same work matrices, row classes,
// padding and scale): equal but for the batch and the replicas, which only say how many matrices
// there are and who else holds them. Matrices of such layouts may share one batched NS.
bool same_work(const ShardLayout& a, const ShardLayout& b);

// A batch of equal shapes holds at most this many bytes of its matrices in fp32 (a larger matrix
// runs alone): one launch per product only pays for small matrices (1024 x 1024 goes 4 to a
// batch, 2048 x 2048 alone), a batch computes its symmetric products in full where one matrix
// at bf16 on cuda computes a triangle, and every matrix of a batch costs its size again in the
// batch's NS scratch (and, gathered, in its own buffer until the batch runs). batch_capacity:
// how many rows x cols matrices a batch takes (at least one).
inline constexpr std::size_t kMaxBatchBytes = std::size_t{16} << 20;
std::size_t batch_capacity(Index rows, Index cols);

// orthogonalize_full on several full work matrices: those of the same work (same_work) and
// algorithm (the slices of a batched parameter, equal-shaped weights) together, up to
// batch_capacity at a time, each NS product one batched call (run_newton_schulz_batch); each
// matrix gets orthogonalize_full's bits. ns's algorithm is replaced by each work's.
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

// Duplicated mode's gather of this rank's shard u into the weight's full work matrix (the
// collectives of orthogonalize_shard), held in ws's buffer (`role`, `slot`) until the caller has
// orthogonalised it (orthogonalize_fulls) and copies this rank's block back (copy_from_full).
// A TP-split weight's GTP-gathered TP-local tensor passes through a buffer of the call.
MatrixView gather_full(MatrixView u, const ShardLayout& layout, const Communicator& tp,
                       const Communicator& gtp, Compute& compute, NsWorkspaces& workspaces,
                       BufferRole role, std::size_t slot);
void copy_from_full(ConstMatrixView full, const ShardLayout& layout, Compute& compute,
                    MatrixView u);

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
