#include "optim_test_util.h"

#include <fmt/format.h>

#include <numeric>

namespace distmuon::test {

Matrix reference_orthogonalize(ConstMatrixView u, const std::vector<Index>& ids,
                               const std::vector<Index>& qkv, const NsOptions& ns,
                               const std::function<double(Index, Index)>& scale) {
  const Index period = std::accumulate(qkv.begin(), qkv.end(), Index{0});
  auto class_of = [&](Index row) {
    if (qkv.empty()) return 0;
    Index within = row % period;
    int c = 0;
    while (within >= qkv[static_cast<std::size_t>(c)])
      within -= qkv[static_cast<std::size_t>(c++)];
    return c;
  };
  Matrix out(u.rows, u.cols);
  const int classes = qkv.empty() ? 1 : static_cast<int>(qkv.size());
  for (int c = 0; c < classes; ++c) {
    std::vector<Index> rows;
    for (Index k = 0; k < u.rows; ++k)
      if (ids[static_cast<std::size_t>(k)] >= 0 && class_of(ids[static_cast<std::size_t>(k)]) == c)
        rows.push_back(k);
    if (rows.empty()) continue;
    Matrix x(static_cast<Index>(rows.size()), u.cols);
    for (std::size_t k = 0; k < rows.size(); ++k)
      copy(u.row_block(rows[k], 1), x.view().row_block(static_cast<Index>(k), 1));
    const Matrix o = reference_newton_schulz<double>(x.view(), ns.coefficients, ns.steps, ns.eps);
    const double f = scale(x.rows(), x.cols());
    for (std::size_t k = 0; k < rows.size(); ++k)
      for (Index j = 0; j < u.cols; ++j)
        out(rows[k], j) = static_cast<float>(o(static_cast<Index>(k), j) * f);
  }
  return out;
}

ReferenceMuon::ReferenceMuon(MuonOptions options, Index m, Index n)
    : o_(std::move(options)), buf_(static_cast<std::size_t>(m * n), 0.0) {}

Matrix ReferenceMuon::advance(Matrix& p, ConstMatrixView g) {
  const double mu = o_.momentum, wd = o_.weight_decay, lr = o_.lr;
  Matrix u(g.rows, g.cols);
  for (Index i = 0; i < g.rows; ++i) {
    for (Index j = 0; j < g.cols; ++j) {
      double gij = g(i, j);
      double& w = buf_[static_cast<std::size_t>(i * g.cols + j)];
      switch (o_.weight_decay_method) {
        case WeightDecayMethod::kDecoupled:
          p(i, j) = static_cast<float>(p(i, j) * (1 - lr * wd));
          break;
        case WeightDecayMethod::kIndependent:
          p(i, j) = static_cast<float>(p(i, j) * (1 - wd));
          break;
        case WeightDecayMethod::kL2:
          gij += wd * p(i, j);
          break;
      }
      w = mu * w + (1 - mu) * gij;
      u(i, j) = static_cast<float>(o_.nesterov ? (1 - mu) * gij + mu * w : w);
    }
  }
  return u;
}

void ReferenceMuon::apply(Matrix& p, ConstMatrixView o) const {
  for (Index i = 0; i < p.rows(); ++i)
    for (Index j = 0; j < p.cols(); ++j)
      p(i, j) = static_cast<float>(p(i, j) - o_.lr * static_cast<double>(o(i, j)));
}

void reference_step(ReferenceMuon& ref, Matrix& p, ConstMatrixView g,
                    const std::vector<Index>& qkv) {
  const Matrix u = ref.advance(p, g);
  std::vector<Index> ids(static_cast<std::size_t>(u.rows()));
  std::iota(ids.begin(), ids.end(), Index{0});
  const MuonOptions& o = ref.options();
  const Matrix upd = reference_orthogonalize(
      u.view(), ids, qkv, o.ns_options(),
      [&](Index m, Index n) { return muon_scale(o.scale_mode, m, n) * o.extra_scale_factor; });
  ref.apply(p, upd.view());
}

bool padding_is_zero(ConstMatrixView shard, const TestLayout& l, int tp_rank, int gtp_rank) {
  for (Index j = 0; j < shard.rows; ++j) {
    if (l.global_row(tp_rank, gtp_rank, j) >= 0) continue;
    for (Index c = 0; c < shard.cols; ++c)
      if (shard(j, c) != 0.0f) return false;
  }
  const Index real_cols = l.tp_dim == 1 ? std::max<Index>(0, l.n - tp_rank * l.n_tp()) : shard.cols;
  for (Index j = 0; j < shard.rows; ++j) {  // tp_pad's columns
    for (Index c = real_cols; c < shard.cols; ++c)
      if (shard(j, c) != 0.0f) return false;
  }
  return true;
}

ParamSpec layout_spec(const TestLayout& l, const ProcessGroups& groups, MatrixView local,
                      const std::string& name) {
  ParamSpec s;
  s.name = name;
  s.local = local;
  s.rows = l.m;
  s.cols = l.n;
  s.tp_partition_dim = l.tp_dim;
  s.tp_group = groups.tp;
  s.gtp_sharded = l.gtp > 1;
  s.gtp_group = groups.gtp;
  s.pad_length = l.pad;
  s.tp_pad_length = l.tp_pad;
  s.qkv_split = l.qkv;
  return s;
}

std::vector<TestLayout> layouts_for(int w) {
  std::vector<TestLayout> out;
  // GTP only (G = world), tall and wide.
  out.push_back({.label = "gtp tall", .m = 36, .n = 24, .gtp = w});
  out.push_back({.label = "gtp wide", .m = 24, .n = 60, .gtp = w});
  // TP only, both partition dims.
  out.push_back({.label = "tp dim0", .m = 36, .n = 24, .tp_dim = 0, .tp = w});
  out.push_back({.label = "tp dim1 wide", .m = 24, .n = 60, .tp_dim = 1, .tp = w});
  out.push_back({.label = "tp dim1 tall", .m = 36, .n = 24, .tp_dim = 1, .tp = w});
  // Padding rows at the end of the GTP-sharded rows: in the last shard only, and over two
  // shards (at G = 2 the last shard is all padding). Tall, so the scale sqrt(max(m, n)) of the
  // unpadded m differs from the padded one.
  out.push_back({.label = "gtp pad one shard", .m = 8 * w - 3, .n = 12, .gtp = w, .pad = 3});
  if (w > 1)
    out.push_back({.label = "gtp pad two shards", .m = 8 * w - 10, .n = 5, .gtp = w, .pad = 10});
  // Uneven TP shards (torch.chunk's: ceil(extent / T) each, the last ones short or empty): the
  // weight padded with zero rows or columns to T of them.
  if (w > 1) {
    const Index c = 3;  // rows / columns per TP shard; the extent leaves the last shard short
    out.push_back(
        {.label = "tp dim0 uneven", .m = c * w - 1, .n = 8, .tp_dim = 0, .tp = w, .tp_pad = 1});
    out.push_back(
        {.label = "tp dim1 uneven", .m = 9, .n = c * w - 2, .tp_dim = 1, .tp = w, .tp_pad = 2});
  }
  // QKV: [q, k, v] and [q, gate, k, v] blocks per query group, groups split across shards.
  out.push_back({.label = "gtp qkv", .m = 24, .n = 20, .gtp = w, .qkv = {4, 2, 2}});
  out.push_back({.label = "gtp qkv gate", .m = 24, .n = 20, .gtp = w, .qkv = {4, 4, 2, 2}});
  out.push_back({.label = "tp dim0 qkv", .m = 24, .n = 20, .tp_dim = 0, .tp = w, .qkv = {4, 2, 2}});
  out.push_back({.label = "tp dim1 qkv", .m = 24, .n = 24, .tp_dim = 1, .tp = w, .qkv = {4, 2, 2}});
  // TP x GTP, every factorisation with both > 1 (the larger group distributes; a tie: GTP).
  for (int t = 2; t < w; ++t) {
    if (w % t != 0 || w / t < 2) continue;
    const int g = w / t;
    const std::string tg = fmt::format("tp{} x gtp{}", t, g);
    out.push_back({.label = tg + " dim0", .m = 36, .n = 24, .tp_dim = 0, .tp = t, .gtp = g});
    out.push_back({.label = tg + " dim1", .m = 36, .n = 24, .tp_dim = 1, .tp = t, .gtp = g});
    out.push_back({.label = tg + " dim1 wide", .m = 12, .n = 48, .tp_dim = 1, .tp = t, .gtp = g});
    // m_tp = 13 rows per TP block, padded to a multiple of G.
    const Index pad = (g - 13 % g) % g + g;
    out.push_back({.label = tg + " dim0 pad",
                   .m = 13 * t,
                   .n = 12,
                   .tp_dim = 0,
                   .tp = t,
                   .gtp = g,
                   .pad = pad});
    out.push_back({.label = tg + " dim1 pad",
                   .m = 13,
                   .n = 6 * t,
                   .tp_dim = 1,
                   .tp = t,
                   .gtp = g,
                   .pad = pad});
    out.push_back({.label = tg + " dim1 uneven pad",
                   .m = 13,
                   .n = 6 * t - 1,
                   .tp_dim = 1,
                   .tp = t,
                   .gtp = g,
                   .pad = pad,
                   .tp_pad = 1});
    out.push_back({.label = tg + " dim0 qkv",
                   .m = 24 * t,
                   .n = 20,
                   .tp_dim = 0,
                   .tp = t,
                   .gtp = g,
                   .qkv = {4, 2, 2}});
    out.push_back({.label = tg + " dim1 qkv gate",
                   .m = 24,
                   .n = 6 * t,
                   .tp_dim = 1,
                   .tp = t,
                   .gtp = g,
                   .qkv = {4, 4, 2, 2}});
  }
  return out;
}

}  // namespace distmuon::test
