#pragma once
// Orthogonalising one sharded Muon update: the layout arithmetic of a TP x GTP sharded, padded,
// possibly QKV-split weight, and the per-mode orchestration (internal to the optimizer).
//
// Every mode is written as three steps:
//   1. build a work matrix P from the local shard (gathered over none, one or both groups), and
//      the global row of each of P's rows (-1 for padding rows);
//   2. per row class (the whole weight, or one QKV block type), collect P's rows of that class
//      into a matrix X and orthogonalise it: locally, or distributed over a group with the Gram
//      matrix on the columns (rows split, any row order, unequal row counts allowed) or on the
//      rows (columns split, every rank holds the same rows in the same order); scale it and
//      write it back; padding rows become zero;
//   3. copy this rank's slice of P back into the shard.

#include <functional>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"
#include "ns/ns_workspaces.h"

namespace distmuon::detail {

struct ShardLayout {
  Index m = 0, n = 0;         // full, unpadded weight shape
  int tp_dim = kNoPartition;  // kNoPartition when not TP-sharded (or TP of one rank)
  int tp_size = 1, tp_rank = 0;
  int gtp_size = 1, gtp_rank = 0;
  Index pad = 0;           // zero rows appended to the TP-local tensor
  std::vector<Index> qkv;  // rows per query group of each block type; empty: no split

  Index m_tp() const { return tp_dim == 0 ? m / tp_size : m; }
  Index n_tp() const { return tp_dim == 1 ? n / tp_size : n; }
  Index padded_rows() const { return m_tp() + pad; }
  Index shard_rows() const { return padded_rows() / gtp_size; }
  // Padding rows at the end of this rank's shard.
  Index local_pad() const;
  // Global row of row i of TP rank t's TP-local (padded) tensor; -1 for a padding row.
  Index global_row(int t, Index i) const;
  int classes() const { return qkv.empty() ? 1 : static_cast<int>(qkv.size()); }
  int row_class(Index global_row) const;
  Index class_rows(int c) const;  // rows of class c in the full weight

  // Throws distmuon::Error when the shape does not split as described.
  void validate(const std::string& what) const;
};

// scale(rows, cols) of an orthogonalised m x n block (scale mode times extra factor).
using ScaleFn = std::function<double(Index, Index)>;

// The work matrix duplicated mode gathers for a weight: every TP rank's TP-local (padded) tensor,
// stacked by rows for tp_dim 0 ((tp_size * padded_rows) x n), side by side for tp_dim 1
// (padded_rows x n), the TP-local tensor itself without TP. full_work_rows/cols give its shape.
Index full_work_rows(const ShardLayout& layout);
Index full_work_cols(const ShardLayout& layout);
// Orthogonalises and scales that full work matrix in place, per row class, zeroing padding rows:
// exactly what duplicated mode runs on it (owner mode runs the same code on the owner rank).
// NS takes its scratch from workspaces when given (kept across steps), else allocates it.
void orthogonalize_full(MatrixView full, const ShardLayout& layout, const NsOptions& ns,
                        const ScaleFn& scale, Compute& compute, NsWorkspaces* workspaces = nullptr);

// Orthogonalises and scales this rank's update shard u (shard_rows x n_tp) in place.
// tp and gtp are this rank's groups (size 1 when absent); mode is not kAuto.
void orthogonalize_shard(MatrixView u, const ShardLayout& layout, const Communicator& tp,
                         const Communicator& gtp, TpMode mode, const NsOptions& ns,
                         const ScaleFn& scale, Compute& compute,
                         NsWorkspaces* workspaces = nullptr);

}  // namespace distmuon::detail
