#pragma once
// Helpers of the optimizer tests: how a full weight is sharded (written from the definition in
// muon.h, independently of the optimizer's own layout code) and a float64 reference Muon of the
// full, unsharded matrix.

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "counting_compute.h"
#include "distmuon/compute.h"
#include "distmuon/muon.h"
#include "distmuon/tp.h"
#include "test_util.h"

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

// Orthogonalises the rows of u by class (the whole matrix, or one QKV block type each), with the
// float64 reference Newton-Schulz, multiplies each class by scale(rows, cols) and zeroes the
// rows whose id is -1. ids[k] is the global row of u's row k.
Matrix reference_orthogonalize(ConstMatrixView u, const std::vector<Index>& ids,
                               const std::vector<Index>& qkv, const NsOptions& ns,
                               const std::function<double(Index, Index)>& scale);

// Muon's momentum, weight decay and update of a full matrix, in float64.
class ReferenceMuon {
 public:
  ReferenceMuon(MuonOptions options, Index m, Index n);
  // Applies weight decay to p and advances the momentum with g; returns u (before NS).
  Matrix advance(Matrix& p, ConstMatrixView g);
  // p -= lr * o.
  void apply(Matrix& p, ConstMatrixView o) const;
  const MuonOptions& options() const { return o_; }

 private:
  MuonOptions o_;
  std::vector<double> buf_;
};

// The full-matrix reference step: u = advance(p, g), orthogonalised over the whole matrix
// (per QKV class), scaled by the class's full shape, applied to p.
void reference_step(ReferenceMuon& ref, Matrix& p, ConstMatrixView g,
                    const std::vector<Index>& qkv);

// Rows of the shard that are padding are exactly zero.
// The ParamSpec of a parameter laid out as l (TP over groups.tp, rows over groups.gtp when
// l.gtp > 1), with this rank's shard `local`.
ParamSpec layout_spec(const TestLayout& l, const ProcessGroups& groups, MatrixView local,
                      const std::string& name);

bool padding_is_zero(ConstMatrixView shard, const TestLayout& l, int tp_rank, int gtp_rank);

// The layouts the optimizer tests run on a world of w ranks: GTP only, TP only (both dims),
// padding (in one and in two shards), QKV splits (with and without gate) and every TP x GTP
// factorisation with both > 1 (with padding and QKV).
std::vector<TestLayout> layouts_for(int w);

// a and b hold the same matrices bit for bit (tolerance 0: the same operations in the same order
// give the same bits); a failure names `what` and the matrix: "<noun> k <differs>".
void expect_same_bits(const std::vector<Matrix>& a, const std::vector<Matrix>& b,
                      const std::string& what, const std::string& noun, const std::string& differs);

}  // namespace distmuon::test
