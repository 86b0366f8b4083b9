#pragma once
// FSDP-style row sharding of weights over a group (GTP: generalised tensor parallelism, where the
// data-parallel ranks each hold a row shard of every Muon weight).
//
// A full [rows, cols] weight is padded with pad_length zero rows to G * shard_rows rows,
// shard_rows = ceil(rows / G), and rank r holds padded rows [r * shard_rows, (r + 1) * shard_rows).
// The padding rows sit at the end of the padded matrix and may span several trailing shards (for
// example 5 rows over 4 ranks: shard_rows 2, pad_length 3, rank 2 holds one real row, rank 3 none).
// This is the layout the optimizer's GTP parameters describe (unpadded shape + pad_length).
//
// Before a forward pass every rank all-gathers the shards into the full weight; after the backward
// pass the full gradients of all ranks are reduce-scattered back to shards and divided by G, so
// each rank holds its rows of the gradient averaged over the ranks' batches. The padding rows of
// a gradient shard are zero.

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/matrix.h"

namespace distmuon {

struct RowSharding {
  Index rows = 0, cols = 0;  // full, unpadded shape
  int group_size = 1;        // G
  Index shard_rows = 0;      // ceil(rows / G)
  Index pad_length = 0;      // G * shard_rows - rows zero rows appended to dim 0

  // Throws distmuon::Error for a negative shape or a group size below 1.
  static RowSharding make(Index rows, Index cols, int group_size);
  // First padded row of a rank's shard, and how many of its rows are real (not padding).
  Index first_row(int rank) const { return static_cast<Index>(rank) * shard_rows; }
  Index real_rows(int rank) const;
  friend bool operator==(const RowSharding&, const RowSharding&) = default;
};

// A host helper (test inputs, benches): a rank's shard of a full host matrix, [shard_rows, cols],
// padding rows zero.
Matrix row_shard(ConstMatrixView full, const RowSharding& sharding, int rank);

// Scratch reused across calls: one padded [G * shard_rows, cols] buffer in the backend's memory
// (reallocated only when the shape or the backend changes).
struct ShardingWorkspace {
  DeviceMatrix padded;
};

// The functions below work on compute's memory (shard, full, m) and move it over group.data()
// (compute.data_communicator(group) when the group has no data plane yet); the shape checks go
// over the control plane.

// Collective over `group` (size G == sharding.group_size): full = the unpadded concatenation of
// every rank's shard. shard must be [shard_rows, cols] and full [rows, cols]; the shapes are
// checked on every rank together (agree_or_throw, agreement.h), so a mismatch on one rank throws
// CollectiveError on all of them instead of hanging.
void all_gather_rows(ConstMatrixView shard, const RowSharding& sharding, const Communicator& group,
                     MatrixView full, ShardingWorkspace& ws, Compute& compute);

// Collective over `group`: shard = this rank's rows of (1/G) * the sum over ranks of their full
// [rows, cols] gradients; padding rows zero.
void reduce_scatter_rows_mean(ConstMatrixView full, const RowSharding& sharding,
                              const Communicator& group, MatrixView shard, ShardingWorkspace& ws,
                              Compute& compute);

// Collective over `group`: m = the mean over ranks of m (replicated parameters' gradients).
void all_reduce_mean(MatrixView m, const Communicator& group, Compute& compute);

}  // namespace distmuon
