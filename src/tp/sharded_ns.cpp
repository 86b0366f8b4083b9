#include "tp/sharded_ns.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "distmuon/error.h"
#include "distmuon/tp.h"

namespace distmuon {
namespace detail {
namespace {

// How a class matrix is orthogonalised.
struct Placement {
  const Communicator* group = nullptr;  // nullptr: local NS
  GramSide side = GramSide::kAuto;      // with a group: kCols (rows split) or kRows
  bool local_scale = false;             // blockwise: scale with the block's own shape
};

NsWorkspace* workspace_for(NsWorkspaces* workspaces, ConstMatrixView x, const NsOptions& o) {
  return workspaces != nullptr ? &workspaces->get(x.rows, x.cols, o.side) : nullptr;
}

// Step 2 of the header: per class, orthogonalise P's rows of that class; zero padding rows.
void orthogonalize_classes(MatrixView p, const std::vector<Index>& ids, const ShardLayout& layout,
                           const Placement& where, const NsOptions& ns, const ScaleFn& scale,
                           Compute& compute, NsWorkspaces* workspaces) {
  DISTMUON_ASSERT(static_cast<Index>(ids.size()) == p.rows, "one id per work row");
  NsOptions o = ns;
  o.side = where.group != nullptr ? where.side : ns.side;
  for (int c = 0; c < layout.classes(); ++c) {
    std::vector<Index> rows;
    for (Index k = 0; k < p.rows; ++k) {
      if (ids[k] >= 0 && layout.row_class(ids[k]) == c) rows.push_back(k);
    }
    const bool distributed = where.group != nullptr && where.group->size() > 1;
    if (rows.empty() && !distributed) continue;
    // A rank holding no row of the class still joins the collectives, with one zero row: it adds
    // nothing to the norm or the Gram matrix (only possible with the Gram on the columns).
    DISTMUON_ASSERT(!rows.empty() || o.side == GramSide::kCols, "rows side needs every row");
    const double f = !scale              ? 1.0
                     : where.local_scale ? scale(static_cast<Index>(rows.size()), p.cols)
                                         : scale(layout.class_rows(c), layout.n);
    const Communicator* group = distributed ? where.group : nullptr;
    // The usual case (no QKV split; padding only at the end) is one run of rows: orthogonalise
    // it in place rather than through a copy.
    if (!rows.empty() && rows.back() - rows.front() + 1 == static_cast<Index>(rows.size())) {
      const MatrixView run = p.row_block(rows.front(), static_cast<Index>(rows.size()));
      newton_schulz_inplace(run, o, compute, group, workspace_for(workspaces, run, o));
      if (scale) compute.scale(run, static_cast<float>(f));
      continue;
    }
    Matrix x(std::max<Index>(1, static_cast<Index>(rows.size())), p.cols);
    for (std::size_t k = 0; k < rows.size(); ++k) {
      compute.copy(p.row_block(rows[k], 1), x.view().row_block(static_cast<Index>(k), 1));
    }
    newton_schulz_inplace(x.view(), o, compute, group, workspace_for(workspaces, x.view(), o));
    if (scale) compute.scale(x.view(), static_cast<float>(f));
    for (std::size_t k = 0; k < rows.size(); ++k) {
      compute.copy(x.view().row_block(static_cast<Index>(k), 1), p.row_block(rows[k], 1));
    }
  }
  for (Index k = 0; k < p.rows; ++k) {
    if (ids[k] < 0) compute.fill(p.row_block(k, 1), 0.0f);
  }
}

}  // namespace

Index full_work_rows(const ShardLayout& layout) {
  const bool tp_rows = layout.tp_dim == 0 && layout.tp_size > 1;
  return layout.padded_rows() * (tp_rows ? layout.tp_size : 1);
}

Index full_work_cols(const ShardLayout& layout) {
  return layout.n;
}

void orthogonalize_full(MatrixView full, const ShardLayout& layout, const NsOptions& ns,
                        const ScaleFn& scale, Compute& compute, NsWorkspaces* workspaces) {
  DISTMUON_ASSERT(full.rows == full_work_rows(layout) && full.cols == full_work_cols(layout),
                  "full work matrix shape");
  const int blocks = layout.tp_dim == 0 && layout.tp_size > 1 ? layout.tp_size : 1;
  std::vector<Index> ids;
  ids.reserve(static_cast<std::size_t>(full.rows));
  // Without a TP row split every TP rank's tensor holds the same global rows (TP rank 0's ids).
  for (int t = 0; t < blocks; ++t) {
    for (Index i = 0; i < layout.padded_rows(); ++i)
      ids.push_back(layout.global_row(t, i));
  }
  orthogonalize_classes(full, ids, layout, {}, ns, scale, compute, workspaces);
}

}  // namespace detail

void orthogonalize_shard(MatrixView u, const ShardLayout& layout, const Communicator& tp,
                         const Communicator& gtp, TpMode mode, const NsOptions& ns,
                         const ScaleFn& scale, Compute& compute, detail::NsWorkspaces* workspaces) {
  DISTMUON_ASSERT(mode != TpMode::kAuto, "auto must be resolved before orthogonalising");
  DISTMUON_ASSERT(mode != TpMode::kOwner, "owner mode orthogonalises buckets (owner_ns.h)");
  DISTMUON_ASSERT(u.rows == layout.shard_rows() && u.cols == layout.n_tp(), "shard shape");
  using detail::orthogonalize_classes;
  const bool tp_on = layout.tp_on(), gtp_on = layout.gtp_on();
  const Index r_l = layout.shard_rows(), r_tp = layout.padded_rows(), n_tp = layout.n_tp();
  const int t_rank = layout.tp_rank, g_rank = layout.gtp_rank;

  // Global rows of TP rank t's TP-local rows [first, first + count).
  auto ids_of = [&](int t, Index first, Index count, std::vector<Index>& ids) {
    for (Index i = 0; i < count; ++i)
      ids.push_back(layout.global_row(t, first + i));
  };
  std::vector<Index> ids;

  if (mode == TpMode::kBlockwise || (!tp_on && !gtp_on)) {
    ids_of(t_rank, g_rank * r_l, r_l, ids);
    orthogonalize_classes(u, ids, layout, {.local_scale = mode == TpMode::kBlockwise}, ns, scale,
                          compute, workspaces);
    return;
  }

  if (mode == TpMode::kDuplicated) {
    // GTP gather -> TP-local tensor; TP gather -> the full (padded per TP block) weight.
    Matrix tp_local = gtp_on ? all_gather_shards(u, 0, gtp, compute) : Matrix(u.rows, u.cols);
    if (!gtp_on) compute.copy(u, tp_local.view());
    Matrix full = !tp_on
                      ? std::move(tp_local)
                      : (layout.tp_dim == 0 ? all_gather_shards(tp_local.view(), 0, tp, compute)
                                            : all_gather_shards(tp_local.view(), 1, tp, compute));
    const int blocks = tp_on && layout.tp_dim == 0 ? layout.tp_size : 1;
    detail::orthogonalize_full(full.view(), layout, ns, scale, compute, workspaces);
    const Index row0 = (blocks > 1 ? t_rank * r_tp : 0) + g_rank * r_l;
    const Index col0 = tp_on && layout.tp_dim == 1 ? t_rank * n_tp : 0;
    compute.copy(full.view().block(row0, col0, r_l, n_tp), u);
    return;
  }

  // distributed
  const bool over_gtp = distributes_over_gtp(layout);
  const GramSide tp_side = layout.tp_dim == 0 ? GramSide::kCols : GramSide::kRows;
  if (tp_on && gtp_on && over_gtp) {
    // Gather over TP, distribute over GTP with the Gram on the columns.
    if (layout.tp_dim == 0) {
      Matrix p = all_gather_shards(u, 0, tp, compute);
      for (int t = 0; t < layout.tp_size; ++t)
        ids_of(t, g_rank * r_l, r_l, ids);
      orthogonalize_classes(p.view(), ids, layout, {&gtp, GramSide::kCols}, ns, scale, compute,
                            workspaces);
      compute.copy(p.view().block(t_rank * r_l, 0, r_l, n_tp), u);
    } else {
      Matrix p = all_gather_shards(u, 1, tp, compute);
      ids_of(t_rank, g_rank * r_l, r_l, ids);
      orthogonalize_classes(p.view(), ids, layout, {&gtp, GramSide::kCols}, ns, scale, compute,
                            workspaces);
      compute.copy(p.view().block(0, t_rank * n_tp, r_l, n_tp), u);
    }
    return;
  }
  if (tp_on && gtp_on) {
    // TP larger: gather over GTP into the TP-local tensor, distribute over TP.
    Matrix p = all_gather_shards(u, 0, gtp, compute);
    ids_of(t_rank, 0, r_tp, ids);
    orthogonalize_classes(p.view(), ids, layout, {&tp, tp_side}, ns, scale, compute, workspaces);
    compute.copy(p.view().block(g_rank * r_l, 0, r_l, n_tp), u);
    return;
  }
  ids_of(t_rank, g_rank * r_l, r_l, ids);
  if (over_gtp) {
    orthogonalize_classes(u, ids, layout, {&gtp, GramSide::kCols}, ns, scale, compute, workspaces);
  } else {
    orthogonalize_classes(u, ids, layout, {&tp, tp_side}, ns, scale, compute, workspaces);
  }
}

}  // namespace distmuon
