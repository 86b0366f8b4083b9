#pragma once
// What newton_schulz_tp costs one rank for a full matrix, in closed form: the collectives it sends
// (calls and payload bytes), the NS problem it really iterates on and its FLOPs. Shared by the
// tests, the TP benchmark and the cost model.

#include <cstddef>

#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp_mode.h"

namespace distmuon {

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

}  // namespace distmuon
