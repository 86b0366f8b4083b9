#pragma once
// How the tests lay a full weight out over ranks, written from the definitions in muon.h and
// layout.h, independently of the library's own layout code: the TestLayout of a weight, this
// rank's shard of it, the ShardLayout the library takes for it, and a T x G x D grid of the
// world (TP x GTP x replicas) with its groups. Shared by the optimizer tests (tests/optim) and
// the NCCL data plane's tests (tests/comm).

#include <algorithm>
#include <string>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/layout.h"
#include "distmuon/matrix.h"
#include "distmuon/tp.h"

namespace distmuon::test {

struct TestLayout {
  std::string label;
  Index m = 0, n = 0;  // full, unpadded
  int tp_dim = kNoPartition;
  int tp = 1, gtp = 1;
  Index pad = 0;
  std::vector<Index> qkv;
  Index tp_pad = 0;  // zero rows/columns appended along tp_dim before the TP split (uneven TP)

  Index m_tp() const { return tp_dim == 0 ? (m + tp_pad) / tp : m; }
  Index n_tp() const { return tp_dim == 1 ? (n + tp_pad) / tp : n; }
  // Columns of TP rank t's shard that hold the weight (at least 1: the scale of an empty block).
  Index tp_cols(int t) const {
    return tp_dim == 1 ? std::max<Index>(1, std::min(n_tp(), n - t * n_tp())) : n_tp();
  }
  Index shard_rows() const { return (m_tp() + pad) / gtp; }
  // Global row of local shard row j on (tp_rank, gtp_rank); -1 for a padding row.
  Index global_row(int tp_rank, int gtp_rank, Index j) const;
};

// This rank's shard of a full m x n matrix: tp_pad zero rows/columns appended along tp_dim, TP
// split along it, pad rows of value pad_fill appended, GTP split of the rows.
Matrix shard_for(ConstMatrixView full, const TestLayout& l, int tp_rank, int gtp_rank,
                 float pad_fill = 0.0f);

// The ShardLayout of l on this rank of groups (TP only when l.tp > 1 along a dimension, GTP when
// l.gtp > 1), its replicas (dp_size, dp_rank) those of `replicas` when given.
ShardLayout shard_layout(const TestLayout& l, const ProcessGroups& groups,
                         const Communicator* replicas = nullptr);

// A T x G x D grid of the world (T G D = world size): TP groups of T ranks, GTP groups of G
// (make_process_groups), and D replicas of every position of the T x G grid.
struct GridSize {
  int T, G, D;
};

// The grids of the world that every grid test covers: TP alone ({w, 1, 1}), GTP alone
// ({1, w, 1}) and, at 4 ranks, TP x GTP ({2, 2, 1}: two gather stages per chunk of owner mode)
// and TP over 2 replicas ({2, 1, 2}: TP, the replicas' exchange, TP).
std::vector<GridSize> world_grids();

// This rank's groups on grid g (collective over the world): TP and GTP, and its replicas (the D
// ranks at its position tp rank + T gtp rank, in world order).
struct GridGroups {
  ProcessGroups pg;
  Communicator replicas;
};
GridGroups grid_groups(const GridSize& g);

// The world as T x G (T = 2 when the world is even, else 1): TP over T, GTP over G.
ProcessGroups tp_gtp_world();

// a and b hold the same matrices bit for bit (tolerance 0: the same operations in the same order
// give the same bits); a failure names `what` and the matrix: "<noun> k <differs>".
void expect_same_bits(const std::vector<Matrix>& a, const std::vector<Matrix>& b,
                      const std::string& what, const std::string& noun, const std::string& differs);

}  // namespace distmuon::test
