#pragma once
// The layout of a sharded weight and the dispatcher that orthogonalises this rank's shard of it in
// every TP mode but owner (owner mode orthogonalises a bucket of weights: src/tp/owner_ns.h).
//
// A weight of full shape m x n may be split over a TP group along tp_dim (rows or columns, equal
// TP shards of the weight padded with tp_pad zero rows or columns: uneven shards as torch.chunk
// cuts them, the last ranks short or empty), each TP-local tensor padded with zero rows to a
// multiple of the GTP group and split by rows over the GTP group; its rows may form QKV blocks
// (query groups of q, [gate,] k, v rows), each block type orthogonalised on its own.
// newton_schulz_tp (tp.h) is the case of one group (TP only, no padding, no QKV split); Muon runs
// every parameter not in owner mode through orthogonalize_shard (src/tp/weight_orthogonalizer.h:
// the one entry point of a step's weights in every mode).
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
// Distributed mode on a TP x GTP weight gathers over the smaller group first and distributes over
// the larger (distributes_over_gtp: the one place that decides, a tie distributes over GTP).

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp_mode.h"

namespace distmuon {

struct ShardLayout {
  Index m = 0, n = 0;         // full, unpadded weight shape
  int tp_dim = kNoPartition;  // kNoPartition when not TP-sharded (or TP of one rank)
  int tp_size = 1, tp_rank = 0;
  int gtp_size = 1, gtp_rank = 0;
  Index pad = 0;             // zero rows appended to the TP-local tensor
  Index tp_pad = 0;          // zero rows (tp_dim 0) or columns (tp_dim 1) appended to the full
                             // weight before the TP split (uneven TP shards)
  std::vector<Index> qkv{};  // rows per query group of each block type; empty: no split
  // Replicas: dp_size ranks (this one dp_rank of them) hold the same shard of the weight (data
  // parallelism: DDP, HSDP's replicate dimension). Replicas never split the matrix; they only say
  // which ranks may share one orthogonalisation (owner mode's homes span them: owner_ns.h).
  int dp_size = 1, dp_rank = 0;
  // Batched parameter: `batch` matrices of this layout (e.g. a layer's experts, [E, m, n]),
  // their shards stacked by rows in the parameter's local view (batch x shard_rows() rows). Every
  // other field and function describes one matrix; each is orthogonalised on its own.
  Index batch = 1;

  bool operator==(const ShardLayout&) const = default;
  bool tp_on() const { return tp_dim != kNoPartition && tp_size > 1; }
  bool gtp_on() const { return gtp_size > 1; }
  bool dp_on() const { return dp_size > 1; }
  Index m_tp() const { return tp_dim == 0 ? (m + tp_pad) / tp_size : m; }
  Index n_tp() const { return tp_dim == 1 ? (n + tp_pad) / tp_size : n; }
  // Columns of TP rank t's TP-local tensor that hold the weight (the rest are tp_pad's zeros).
  Index tp_cols(int t) const;
  Index padded_rows() const { return m_tp() + pad; }
  Index shard_rows() const { return padded_rows() / gtp_size; }
  // Padding rows at the end of this rank's shard.
  Index local_pad() const;
  // Global row of row i of TP rank t's TP-local (padded) tensor; -1 for a padding row (pad's or
  // tp_pad's).
  Index global_row(int t, Index i) const;
  int classes() const { return qkv.empty() ? 1 : static_cast<int>(qkv.size()); }
  int row_class(Index global_row) const;
  Index class_rows(int c) const;  // rows of class c in the full weight

  // Throws distmuon::Error when the shape does not split as described.
  void validate(const std::string& what) const;
};

// The layout of equal shards (shard_rows x shard_cols each) of one matrix split along
// partition_dim over a group of group_size ranks, this rank being `rank` (newton_schulz_tp's
// case). kNoPartition or a group of one: the shard is the whole matrix.
ShardLayout group_layout(Index shard_rows, Index shard_cols, int partition_dim, int group_size,
                         int rank);

// Distributed mode: whether the Gram matrix is all-reduced over the GTP group (true) or the TP
// group (false). Only one group sharded: that group. Both: the larger one, the smaller one being
// all-gathered first; a tie distributes over GTP. Neither: false (the local NS).
bool distributes_over_gtp(const ShardLayout& layout);

// scale(rows, cols) of an orthogonalised rows x cols block (Muon: scale mode times extra factor).
// An empty ScaleFn leaves the result unscaled.
using ScaleFn = std::function<double(Index, Index)>;

// Orthogonalises and scales this rank's shard u (shard_rows x n_tp) in place, in `mode`.
// tp and gtp are this rank's groups (size 1 when absent). mode is blockwise, duplicated or
// distributed (auto is resolved by the caller, owner orthogonalises a list of weights). The
// local NS (unsharded, blockwise, duplicated) keeps ns.side; distributed mode puts the Gram
// matrix on the unsplit side. Collective over the groups the mode uses.
// u lives in compute's memory; shards and Gram matrices move over tp.data() and gtp.data(), which
// must move compute's memory (Compute::data_communicator). NS scratch and the gathered buffers
// are allocated for this call (the optimizer keeps its own across calls: no allocation once every
// shape has been seen). A non-finite input throws on
// the CPU backend; on a device backend it is not checked here (no host wait): the rows of the
// class it is in come out NaN, for the caller to check (Muon does, once per step).
void orthogonalize_shard(MatrixView u, const ShardLayout& layout, const Communicator& tp,
                         const Communicator& gtp, TpMode mode, const NsOptions& ns,
                         const ScaleFn& scale, Compute& compute);

// Owner mode's assignment of a bucket's weights to its ranks (the optimizer's, and the cost
// model's estimate of it: estimate_owner_bucket in cost_model.h). LPT (longest processing time
// first): items in decreasing cost (ties: lower index first) each go to the least-loaded of
// `ranks` bins (ties: lower bin). Returns the bin of each item. Deterministic; its makespan is at
// most 4/3 - 1/(3 ranks) of the optimum.
std::vector<int> lpt_assign(std::span<const double> costs, int ranks);

}  // namespace distmuon
