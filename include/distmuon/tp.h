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
//  - owner:       for a list of weights (the optimizer's buckets, src/optim/owner_ns.h): each
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
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"

namespace distmuon {

enum class TpMode { kBlockwise, kDuplicated, kDistributed, kAuto, kOwner };
TpMode parse_tp_mode(std::string_view name);  // throws, listing the valid names
const char* to_string(TpMode mode);

// Partition dimension of a sharded matrix: kNone (replicated), 0 (rows) or 1 (columns).
inline constexpr int kNoPartition = -1;
int parse_partition_dim(std::string_view text);  // "none", "0", "1"

// Orthogonalises this rank's shard in place. Shards must be equal on every rank of the group;
// a mismatch throws distmuon::CollectiveError on every rank (checked once per distinct shape).
// partition_dim kNoPartition (or a group of one) is the local NS whatever the mode.
// mode must not be kAuto (resolve it first).
void newton_schulz_tp(MatrixView shard, int partition_dim, const Communicator& group, TpMode mode,
                      const NsOptions& opts, Compute& compute = cpu_compute());

// What newton_schulz_tp sends from one rank for a full M x N matrix (m, n) over a group of
// group_size ranks: calls and payload bytes as counting_communicator counts them (all-gather:
// the gathered size, group_size * chunk; all-reduce: the reduced buffer). elem_size is the size
// of the element NS runs in (4 for fp32); the norm all-reduce is always one double (8 bytes).
//  - blockwise, partition_dim kNoPartition or group_size 1: nothing.
//  - duplicated:  1 all-gather of m * n * elem_size bytes.
//  - distributed: steps all-reduces of s * s * elem_size bytes (s = n for partition_dim 0,
//                 m for 1) plus 1 all-reduce of 8 bytes (the squared norm); with the Gram
//                 algorithm 1 (+ 1 per restart) s * s all-reduce instead of steps.
// Not included: the one-time shard-shape check, an all-gather of 3 int64 per rank
// (24 * group_size bytes) the first time a (group, shard shape) pair is seen.
struct TpTraffic {
  std::size_t all_gather_calls = 0;
  std::size_t all_gather_bytes = 0;
  std::size_t all_reduce_calls = 0;
  std::size_t all_reduce_bytes = 0;
  friend bool operator==(const TpTraffic&, const TpTraffic&) = default;
};
TpTraffic tp_traffic(Index m, Index n, int group_size, int partition_dim, TpMode mode, int steps,
                     int elem_size = 4);
// The same for opts' algorithm: with NsAlgorithm::kGram the distributed mode all-reduces
// gram_ns_gram_count(opts) Gram matrices (1 without restarts) instead of steps.
TpTraffic tp_traffic(Index m, Index n, int group_size, int partition_dim, TpMode mode,
                     const NsOptions& opts, int elem_size = 4);

// The NS problem one rank really runs in newton_schulz_tp for a full M x N matrix: the local
// matrix (rows x cols) and the Gram side, resolved (kRows or kCols). blockwise: the shard with
// the requested side (kAuto: its smaller dimension); duplicated: the full matrix likewise;
// distributed: the shard with kCols for partition_dim 0 and kRows for 1. Unsharded or a group of
// one: the full matrix. Used for FLOP counts and for benchmarking the products NS issues.
struct TpLocalNs {
  Index rows = 0, cols = 0;
  GramSide side = GramSide::kRows;
  Index gram_dim() const { return side == GramSide::kRows ? rows : cols; }
  Index long_dim() const { return side == GramSide::kRows ? cols : rows; }
};
TpLocalNs tp_local_ns(Index m, Index n, int group_size, int partition_dim, TpMode mode,
                      GramSide requested = GramSide::kAuto);

// FLOPs one rank executes in newton_schulz_tp for a full M x N matrix (ns_flops of the matrix the
// mode really iterates on, with the Gram side it uses and opts' algorithm, syrk setting and
// coefficients; the Gram algorithm's s x s iteration runs redundantly on every rank):
// blockwise the shard, duplicated the full matrix, distributed the shard with the Gram side
// fixed by partition_dim. Elementwise work (norm, scaling, B = bA + cA^2 + aI) is not counted.
double tp_flops(Index m, Index n, int group_size, int partition_dim, TpMode mode,
                const NsOptions& opts);

// Splits a full matrix into `parts` equal shards along dim (throws if not divisible), and
// reassembles shards (in rank order) into the full matrix. Copies go through compute.
Matrix shard_of(ConstMatrixView full, int dim, int parts, int index,
                Compute& compute = cpu_compute());
Matrix unshard(const std::vector<Matrix>& shards, int dim, Compute& compute = cpu_compute());
// All-gathers this rank's equal shard along dim (0: rows, 1: columns) into the full matrix,
// shards in group rank order. One all-gather; columns are interleaved after it (with compute).
Matrix all_gather_shards(ConstMatrixView shard, int dim, const Communicator& group,
                         Compute& compute = cpu_compute());

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
