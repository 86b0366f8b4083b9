#pragma once
// Helpers of the optimizer tests: a float64 reference Muon of the full, unsharded matrix, the
// ParamSpec of a weight laid out as a TestLayout (how a full weight is sharded: test_layout.h)
// and the layouts the optimizer tests run on.

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "counting_compute.h"
#include "distmuon/compute.h"
#include "distmuon/muon.h"
#include "distmuon/tp.h"
#include "test_layout.h"
#include "test_util.h"

namespace distmuon::test {

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

}  // namespace distmuon::test
