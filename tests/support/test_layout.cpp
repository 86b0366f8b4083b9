#include "test_layout.h"

#include <gtest/gtest.h>

#include <cstring>

#include "test_util.h"

namespace distmuon::test {

Index TestLayout::global_row(int tp_rank, int gtp_rank, Index j) const {
  const Index i = gtp_rank * shard_rows() + j;  // row of the padded TP-local tensor
  if (i >= m_tp()) return -1;
  const Index row = tp_dim == 0 ? tp_rank * m_tp() + i : i;
  return row < m ? row : -1;  // tp_pad's rows
}

Matrix shard_for(ConstMatrixView full, const TestLayout& l, int tp_rank, int gtp_rank,
                 float pad_fill) {
  Matrix extended(full.rows + (l.tp_dim == 0 ? l.tp_pad : 0),
                  full.cols + (l.tp_dim == 1 ? l.tp_pad : 0));  // zero-initialised
  copy(full, extended.view().block(0, 0, full.rows, full.cols));
  const Matrix tp_local = l.tp_dim == kNoPartition
                              ? Matrix::from(full)
                              : shard_of(extended.view(), l.tp_dim, l.tp, tp_rank);
  Matrix padded(tp_local.rows() + l.pad, tp_local.cols());
  copy(tp_local.view(), padded.view().row_block(0, tp_local.rows()));
  for (Index i = tp_local.rows(); i < padded.rows(); ++i)
    for (Index j = 0; j < padded.cols(); ++j)
      padded(i, j) = pad_fill;
  return shard_of(padded.view(), 0, l.gtp, gtp_rank);
}

ShardLayout shard_layout(const TestLayout& l, const ProcessGroups& groups,
                         const Communicator* replicas) {
  ShardLayout s{.m = l.m, .n = l.n, .pad = l.pad, .tp_pad = l.tp_pad, .qkv = l.qkv};
  if (l.tp_dim != kNoPartition && l.tp > 1) {
    s.tp_dim = l.tp_dim;
    s.tp_size = l.tp;
    s.tp_rank = groups.tp.rank();
  }
  s.gtp_size = l.gtp;
  s.gtp_rank = l.gtp > 1 ? groups.gtp.rank() : 0;
  if (replicas != nullptr) {
    s.dp_size = replicas->size();
    s.dp_rank = replicas->rank();
  }
  return s;
}

std::vector<GridSize> world_grids() {
  const int w = world().size();
  std::vector<GridSize> grids = {{w, 1, 1}, {1, w, 1}};
  if (w == 4) {
    grids.push_back({2, 2, 1});
    grids.push_back({2, 1, 2});
  }
  return grids;
}

GridGroups grid_groups(const GridSize& g) {
  const Communicator& w = world();
  ProcessGroups pg = make_process_groups(w, g.T, g.G);
  const int position = pg.tp.rank() + g.T * pg.gtp.rank();
  Communicator replicas = w.split(position, w.rank());
  return {std::move(pg), std::move(replicas)};
}

void expect_same_bits(const std::vector<Matrix>& a, const std::vector<Matrix>& b,
                      const std::string& what, const std::string& noun,
                      const std::string& differs) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].rows(), b[k].rows()) << what << ": " << noun << " " << k;
    ASSERT_EQ(a[k].cols(), b[k].cols()) << what << ": " << noun << " " << k;
    EXPECT_EQ(std::memcmp(a[k].data(), b[k].data(),
                          sizeof(float) * static_cast<std::size_t>(a[k].size())),
              0)
        << what << ": " << noun << " " << k << " " << differs;
  }
}

ProcessGroups tp_gtp_world() {
  const Communicator& w = world();
  const int t = w.size() % 2 == 0 ? 2 : 1;
  return make_process_groups(w, t, w.size() / t);
}

}  // namespace distmuon::test
