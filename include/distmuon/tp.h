#pragma once
// Tensor-parallel Newton-Schulz: orthogonalising a matrix whose equal shards live on the ranks
// of a group, and the process groups (TP x GTP x data-parallel replicas) that hold them.
//
// Modes (for a full M x N matrix split along partition_dim over G ranks):
//  - blockwise:   NS of the local shard on its own; no communication (changes the maths).
//  - duplicated:  all-gather the shards, NS of the full matrix along min(M, N) on every rank,
//                 keep this rank's slice. One all-gather of M N elements.
//  - distributed: keep the shard; normalise by the global Frobenius norm (one all-reduce of a
//                 double) and all-reduce the Gram matrix once per step. partition_dim 0 iterates
//                 on shard^T (Gram N x N), partition_dim 1 on the shard (Gram M x M).
//  - owner:       for a list of weights (the optimizer's buckets, src/tp/owner_ns.h): each
//                 full weight is gathered on one owner rank, orthogonalised there as in
//                 duplicated mode (bit-equal result) and scattered back. Not a mode of one matrix:
//                 newton_schulz_tp and the per-matrix traffic/FLOP functions reject it.
//  - auto:        resolved per weight by the cost model (see cost_model.h) before calling here.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/layout.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp_mode.h"
#include "distmuon/tp_traffic.h"

namespace distmuon {

// Orthogonalises this rank's shard (compute's memory) in place. Shards must be equal on every
// rank of the group; a mismatch throws distmuon::CollectiveError on every rank (agreed on every
// sharded call but blockwise's, whose NS is rank-local). partition_dim kNoPartition (or a group of
// one) is the local NS whatever the mode. mode must not be kAuto (resolve it first). The one-group
// case of orthogonalize_shard (layout.h, over group_layout), without scaling. The shards and Gram
// matrices move over group.data(); a group without a data plane gets
// compute.data_communicator(group). A non-finite input leaves the result NaN on every backend,
// and the result is checked for non-finite values (agreed over the group when sharded:
// CollectiveError scoped to the group on its every rank; distmuon::Error when unsharded), so none
// is handed back.
void newton_schulz_tp(MatrixView shard, int partition_dim, const Communicator& group, TpMode mode,
                      const NsOptions& opts, Compute& compute);

// Host helpers (test inputs, the CLI's files): splits a full host matrix into `parts` equal
// shards along dim (throws if not divisible), and reassembles host shards (in rank order) into
// the full matrix.
Matrix shard_of(ConstMatrixView full, int dim, int parts, int index);
Matrix unshard(const std::vector<Matrix>& shards, int dim);
// All-gathers this rank's equal shard (compute's memory) along dim (0: rows, 1: columns) into
// the full matrix in compute's memory, shards in group rank order. One all-gather over
// group.data(); columns are interleaved after it (one compute.copy per rank).
DeviceMatrix all_gather_shards(ConstMatrixView shard, int dim, const Communicator& group,
                               Compute& compute);

// Communicators of one rank for world = TP x GTP x replicas, TP varying fastest (Megatron):
// world_rank = tp_rank + tp * (gtp_rank + gtp * replica).
struct ProcessGroups {
  Communicator world;
  Communicator tp;   // ranks that share gtp_rank and replica
  Communicator gtp;  // ranks that share tp_rank and replica
  Communicator dp;   // all ranks with the same tp_rank (the data-parallel ranks: GTP x replicas)
  int tp_size = 1, gtp_size = 1, replicas = 1;
};
ProcessGroups make_process_groups(const Communicator& world, int tp_size, int gtp_size);

}  // namespace distmuon
