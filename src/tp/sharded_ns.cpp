#include "tp/sharded_ns.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "distmuon/error.h"
#include "distmuon/tp.h"
#include "ns/batched_newton_schulz.h"
#include "ns/ns_steps.h"

namespace distmuon {
namespace detail {
namespace {

// How a class matrix is orthogonalised.
struct Placement {
  const Communicator* group = nullptr;  // nullptr: local NS
  GramSide side = GramSide::kAuto;      // with a group: kCols (rows split) or kRows
  bool local_scale = false;             // blockwise: scale with the block's own shape
  Index local_cols = 0;                 // blockwise: the block's columns (tp_pad's excluded)
};

NsWorkspace* workspace_for(NsWorkspaces& workspaces, ConstMatrixView x, const NsOptions& o) {
  return &workspaces.get(x.rows, x.cols, o.side);
}

// The maximal runs [first, first + count) of consecutive entries of a sorted list of rows.
std::vector<std::pair<Index, Index>> runs_of(const std::vector<Index>& rows) {
  std::vector<std::pair<Index, Index>> runs;
  for (const Index k : rows) {
    if (!runs.empty() && runs.back().first + runs.back().second == k) {
      ++runs.back().second;
    } else {
      runs.emplace_back(k, 1);
    }
  }
  return runs;
}

// Step 2 of the header for a batch of work matrices of one layout, all with P's row ids and
// orthogonalised locally: per class, every P's rows of that class in one batched NS
// (run_newton_schulz_batch), each scaled; padding rows zeroed. Per matrix the same operations
// as orthogonalize_classes with no group.
void orthogonalize_classes_local(std::span<const MatrixView> ps, const std::vector<Index>& ids,
                                 const ShardLayout& layout, const Placement& where,
                                 const NsOptions& ns, const ScaleFn& scale, Compute& compute,
                                 NsWorkspaces& workspaces) {
  if (ps.empty()) return;
  const std::size_t count = ps.size();
  std::vector<Index> rows;
  std::vector<MatrixView> xs(count);
  for (int c = 0; c < layout.classes(); ++c) {
    rows.clear();
    for (Index k = 0; k < ps[0].rows; ++k) {
      if (ids[k] >= 0 && layout.row_class(ids[k]) == c) rows.push_back(k);
    }
    if (rows.empty()) continue;
    const double f = !scale              ? 1.0
                     : where.local_scale ? scale(static_cast<Index>(rows.size()), where.local_cols)
                                         : scale(layout.class_rows(c), layout.n);
    const auto runs = runs_of(rows);
    const auto n_rows = static_cast<Index>(rows.size());
    for (std::size_t i = 0; i < count; ++i) {
      if (runs.size() == 1) {  // one run of rows: orthogonalised in place
        xs[i] = ps[i].row_block(runs[0].first, runs[0].second);
        continue;
      }
      xs[i] =
          workspaces
              .buffer(compute, BufferRole::kClassRows,
                      static_cast<std::size_t>(c) + i * static_cast<std::size_t>(layout.classes()),
                      n_rows, ps[i].cols)
              .view();
      Index at = 0;
      for (const auto& [first, n] : runs) {
        compute.copy(ps[i].row_block(first, n), xs[i].row_block(at, n));
        at += n;
      }
    }
    if (count == 1 || !compute.batches_newton_schulz()) {  // each matrix's NS in turn
      NsWorkspace& w = workspaces.get(n_rows, xs[0].cols, ns.side);
      for (const MatrixView& x : xs)
        run_newton_schulz(x, ns, compute, nullptr, &w, NormCheck::kBackend);
    } else {  // batches of at most batch_capacity matrices
      const std::size_t cap = batch_capacity(n_rows, xs[0].cols);
      for (std::size_t first = 0; first < count; first += cap) {
        const std::size_t n = std::min(cap, count - first);
        run_newton_schulz_batch(std::span<const MatrixView>(xs).subspan(first, n), ns, compute,
                                &workspaces.batch(n, n_rows, xs[0].cols, ns.side),
                                NormCheck::kBackend);
      }
    }
    for (std::size_t i = 0; i < count; ++i) {
      if (scale) compute.scale(xs[i], static_cast<float>(f));
      if (runs.size() == 1) continue;
      Index at = 0;
      for (const auto& [first, n] : runs) {
        compute.copy(xs[i].row_block(at, n), ps[i].row_block(first, n));
        at += n;
      }
    }
  }
  rows.clear();
  for (Index k = 0; k < ps[0].rows; ++k) {
    if (ids[k] < 0) rows.push_back(k);
  }
  for (const MatrixView& p : ps) {
    for (const auto& [first, n] : runs_of(rows))
      compute.fill(p.row_block(first, n), 0.0f);
  }
}

// Step 2 of the header: per class, orthogonalise P's rows of that class; zero padding rows.
// Rows are moved by runs of consecutive rows (one compute.copy or fill per run). On a device
// backend a non-finite class matrix is not refused here: its rows come out NaN (the caller
// checks, once per optimizer step).
void orthogonalize_classes(MatrixView p, const std::vector<Index>& ids, const ShardLayout& layout,
                           const Placement& where, const NsOptions& ns, const ScaleFn& scale,
                           Compute& compute, NsWorkspaces& workspaces) {
  DISTMUON_ASSERT(static_cast<Index>(ids.size()) == p.rows, "one id per work row");
  NsOptions o = ns;
  o.side = where.group != nullptr ? where.side : ns.side;
  if (where.group == nullptr || where.group->size() <= 1) {
    orthogonalize_classes_local(std::span<const MatrixView>(&p, 1), ids, layout, where, o, scale,
                                compute, workspaces);
    return;
  }
  std::vector<Index> rows;
  for (int c = 0; c < layout.classes(); ++c) {
    rows.clear();
    for (Index k = 0; k < p.rows; ++k) {
      if (ids[k] >= 0 && layout.row_class(ids[k]) == c) rows.push_back(k);
    }
    const bool distributed = where.group != nullptr && where.group->size() > 1;
    if (rows.empty() && !distributed) continue;
    // A rank holding no row of the class still joins the collectives, with one zero row: it adds
    // nothing to the norm or the Gram matrix (only possible with the Gram on the columns).
    DISTMUON_ASSERT(!rows.empty() || o.side == GramSide::kCols, "rows side needs every row");
    const double f = !scale              ? 1.0
                     : where.local_scale ? scale(static_cast<Index>(rows.size()), where.local_cols)
                                         : scale(layout.class_rows(c), layout.n);
    const Communicator* group = distributed ? where.group : nullptr;
    const auto runs = runs_of(rows);
    // The usual case (no QKV split; padding only at the end) is one run of rows: orthogonalise
    // it in place rather than through a copy.
    if (runs.size() == 1) {
      const MatrixView run = p.row_block(runs[0].first, runs[0].second);
      run_newton_schulz(run, o, compute, group, workspace_for(workspaces, run, o),
                        NormCheck::kBackend);
      if (scale) compute.scale(run, static_cast<float>(f));
      continue;
    }
    DeviceMatrix& buf =
        workspaces.buffer(compute, BufferRole::kClassRows, static_cast<std::size_t>(c),
                          std::max<Index>(1, static_cast<Index>(rows.size())), p.cols);
    const MatrixView x = buf.view();
    if (rows.empty()) compute.fill(x, 0.0f);
    Index at = 0;
    for (const auto& [first, count] : runs) {
      compute.copy(p.row_block(first, count), x.row_block(at, count));
      at += count;
    }
    run_newton_schulz(x, o, compute, group, workspace_for(workspaces, x, o), NormCheck::kBackend);
    if (scale) compute.scale(x, static_cast<float>(f));
    at = 0;
    for (const auto& [first, count] : runs) {
      compute.copy(x.row_block(at, count), p.row_block(first, count));
      at += count;
    }
  }
  rows.clear();
  for (Index k = 0; k < p.rows; ++k) {
    if (ids[k] < 0) rows.push_back(k);
  }
  for (const auto& [first, count] : runs_of(rows))
    compute.fill(p.row_block(first, count), 0.0f);
}

}  // namespace

bool same_work(const ShardLayout& a, const ShardLayout& b) {
  // Every field compared but these (a field added to the layout counts unless named here).
  auto work = [](ShardLayout l) {
    l.batch = 1;
    l.dp_size = 1;
    l.dp_rank = 0;
    return l;
  };
  return work(a) == work(b);
}

std::size_t batch_capacity(Index rows, Index cols) {
  const auto bytes = static_cast<std::size_t>(std::max<Index>(1, rows * cols)) * sizeof(float);
  return std::max<std::size_t>(1, kMaxBatchBytes / bytes);
}

Index full_work_rows(const ShardLayout& layout) {
  const bool tp_rows = layout.tp_dim == 0 && layout.tp_size > 1;
  return layout.padded_rows() * (tp_rows ? layout.tp_size : 1);
}

Index full_work_cols(const ShardLayout& layout) {
  const bool tp_cols = layout.tp_dim == 1 && layout.tp_size > 1;
  return tp_cols ? layout.n_tp() * layout.tp_size : layout.n;  // tp_pad's columns included
}

namespace {

// The global row of each row of the full work matrix (-1: padding).
std::vector<Index> full_work_ids(const ShardLayout& layout) {
  const int blocks = layout.tp_dim == 0 && layout.tp_size > 1 ? layout.tp_size : 1;
  std::vector<Index> ids;
  ids.reserve(static_cast<std::size_t>(full_work_rows(layout)));
  // Without a TP row split every TP rank's tensor holds the same global rows (TP rank 0's ids).
  for (int t = 0; t < blocks; ++t) {
    for (Index i = 0; i < layout.padded_rows(); ++i)
      ids.push_back(layout.global_row(t, i));
  }
  return ids;
}

}  // namespace

void orthogonalize_full(MatrixView full, const ShardLayout& layout, const NsOptions& ns,
                        const ScaleFn& scale, Compute& compute, NsWorkspaces& workspaces) {
  DISTMUON_ASSERT(full.rows == full_work_rows(layout) && full.cols == full_work_cols(layout),
                  "full work matrix shape");
  orthogonalize_classes(full, full_work_ids(layout), layout, {}, ns, scale, compute, workspaces);
}

void orthogonalize_fulls(std::span<const FullWork> works, const NsOptions& ns, const ScaleFn& scale,
                         Compute& compute, NsWorkspaces& workspaces) {
  NsOptions gram = ns;
  gram.algorithm = NsAlgorithm::kGram;
  std::vector<bool> done(works.size(), false);
  std::vector<MatrixView> batch;
  for (std::size_t i = 0; i < works.size(); ++i) {
    if (done[i]) continue;
    const FullWork& w = works[i];
    batch.clear();
    for (std::size_t j = i; j < works.size(); ++j) {
      if (!done[j] && works[j].algorithm == w.algorithm && same_work(*works[j].layout, *w.layout)) {
        DISTMUON_ASSERT(works[j].full.rows == full_work_rows(*w.layout) &&
                            works[j].full.cols == full_work_cols(*w.layout),
                        "full work matrix shape");
        batch.push_back(works[j].full);
        done[j] = true;
      }
    }
    orthogonalize_classes_local(batch, full_work_ids(*w.layout), *w.layout, {},
                                w.algorithm == NsAlgorithm::kGram ? gram : ns, scale, compute,
                                workspaces);
  }
}

void orthogonalize_shards(std::span<const MatrixView> us, const ShardLayout& layout,
                          const Communicator& tp, const Communicator& gtp, TpMode mode,
                          const NsOptions& ns, const ScaleFn& scale, Compute& compute,
                          NsWorkspaces& ws) {
  const bool local = mode == TpMode::kBlockwise || (!layout.tp_on() && !layout.gtp_on());
  if (us.size() <= 1 || (!local && mode != TpMode::kDuplicated)) {
    for (const MatrixView& u : us)
      orthogonalize_shard(u, layout, tp, gtp, mode, ns, scale, compute, &ws);
    return;
  }
  for (const MatrixView& u : us)
    DISTMUON_ASSERT(u.rows == layout.shard_rows() && u.cols == layout.n_tp(), "shard shape");
  const Index r_l = layout.shard_rows(), r_tp = layout.padded_rows(), n_tp = layout.n_tp();
  const int t_rank = layout.tp_rank, g_rank = layout.gtp_rank;
  if (local) {  // blockwise's (or an unsharded weight's) ids and scale, as orthogonalize_shard
    std::vector<Index> ids;
    for (Index i = 0; i < r_l; ++i)
      ids.push_back(layout.global_row(t_rank, g_rank * r_l + i));
    const Index cols = std::max<Index>(1, layout.tp_cols(t_rank));
    orthogonalize_classes_local(us, ids, layout,
                                {.local_scale = mode == TpMode::kBlockwise, .local_cols = cols}, ns,
                                scale, compute, ws);
    return;
  }
  // Duplicated: the batch gathered over GTP in one collective, then over TP in one, each
  // matrix's rows (columns) where its own gather puts them (the same values: copies only); the
  // full matrices orthogonalised as one batch, each rank's block copied back.
  const std::size_t b = us.size();
  std::vector<MatrixView> fulls(us.begin(), us.end());
  const auto stacked = [&](BufferRole role, Index rows, Index cols) {
    const MatrixView all = ws.buffer(compute, role, 0, static_cast<Index>(b) * rows, cols).view();
    for (std::size_t i = 0; i < b; ++i)
      fulls[i] = all.row_block(static_cast<Index>(i) * rows, rows);
  };
  if (layout.gtp_on()) {
    const std::vector<MatrixView> shards(us.begin(), us.end());
    stacked(BufferRole::kTpLocal, r_tp, n_tp);
    gather_batch_into(shards, 0, gtp, compute, ws, fulls);
  }
  if (layout.tp_on()) {
    const std::vector<MatrixView> tp_locals = fulls;
    stacked(BufferRole::kFull, full_work_rows(layout), full_work_cols(layout));
    gather_batch_into(tp_locals, layout.tp_dim, tp, compute, ws, fulls);
  }
  orthogonalize_classes_local(fulls, full_work_ids(layout), layout, {}, ns, scale, compute, ws);
  for (std::size_t i = 0; i < us.size(); ++i)
    copy_from_full(fulls[i], layout, compute, us[i]);
}

MatrixView gather_full(MatrixView u, const ShardLayout& layout, const Communicator& tp,
                       const Communicator& gtp, Compute& compute, NsWorkspaces& ws, BufferRole role,
                       std::size_t slot) {
  DISTMUON_ASSERT(layout.tp_on() || layout.gtp_on(), "a sharded weight");
  DISTMUON_ASSERT(u.rows == layout.shard_rows() && u.cols == layout.n_tp(), "shard shape");
  MatrixView tp_local = u;
  if (layout.gtp_on()) {  // with TP, only until the TP gather has read it
    tp_local =
        layout.tp_on()
            ? ws.buffer(compute, BufferRole::kTpLocal, 0, layout.padded_rows(), layout.n_tp())
                  .view()
            : ws.buffer(compute, role, slot, layout.padded_rows(), layout.n_tp()).view();
    gather_shards_into(u, 0, gtp, compute, ws, tp_local);
  }
  if (!layout.tp_on()) return tp_local;
  const MatrixView full =
      ws.buffer(compute, role, slot, full_work_rows(layout), full_work_cols(layout)).view();
  gather_shards_into(tp_local, layout.tp_dim, tp, compute, ws, full);
  return full;
}

void copy_from_full(ConstMatrixView full, const ShardLayout& layout, Compute& compute,
                    MatrixView u) {
  const Index r_l = layout.shard_rows(), r_tp = layout.padded_rows(), n_tp = layout.n_tp();
  const bool row_blocks = layout.tp_on() && layout.tp_dim == 0;
  const Index row0 = (row_blocks ? layout.tp_rank * r_tp : 0) + layout.gtp_rank * r_l;
  const Index col0 = layout.tp_on() && layout.tp_dim == 1 ? layout.tp_rank * n_tp : 0;
  compute.copy(full.block(row0, col0, r_l, n_tp), u);
}

void orthogonalize_shard(MatrixView u, const ShardLayout& layout, const Communicator& tp,
                         const Communicator& gtp, TpMode mode, const NsOptions& ns,
                         const ScaleFn& scale, Compute& compute, NsWorkspaces* workspaces) {
  DISTMUON_ASSERT(mode != TpMode::kAuto, "auto must be resolved before orthogonalising");
  DISTMUON_ASSERT(mode != TpMode::kOwner, "owner mode orthogonalises buckets (tp/owner_ns.h)");
  DISTMUON_ASSERT(u.rows == layout.shard_rows() && u.cols == layout.n_tp(), "shard shape");
  using detail::BufferRole;
  using detail::gather_shards_into;
  using detail::orthogonalize_classes;
  detail::NsWorkspaces call_workspaces;  // only when the caller keeps none
  detail::NsWorkspaces& ws = workspaces != nullptr ? *workspaces : call_workspaces;
  auto buffer = [&](BufferRole role, Index rows, Index cols) -> MatrixView {
    return ws.buffer(compute, role, 0, rows, cols).view();
  };
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
    // A block of tp_pad's columns only (an empty TP rank) is zero: any positive scale will do.
    const Index cols = std::max<Index>(1, layout.tp_cols(t_rank));
    orthogonalize_classes(u, ids, layout,
                          {.local_scale = mode == TpMode::kBlockwise, .local_cols = cols}, ns,
                          scale, compute, ws);
    return;
  }

  if (mode == TpMode::kDuplicated) {
    // GTP gather -> TP-local tensor; TP gather -> the full (padded per TP block) weight.
    const MatrixView full =
        detail::gather_full(u, layout, tp, gtp, compute, ws, BufferRole::kFull, 0);
    detail::orthogonalize_full(full, layout, ns, scale, compute, ws);
    detail::copy_from_full(full, layout, compute, u);
    return;
  }

  // distributed
  const bool over_gtp = distributes_over_gtp(layout);
  const GramSide tp_side = layout.tp_dim == 0 ? GramSide::kCols : GramSide::kRows;
  if (tp_on && gtp_on && over_gtp) {
    // Gather over TP, distribute over GTP with the Gram on the columns.
    const int t = layout.tp_size;
    if (layout.tp_dim == 0) {
      const MatrixView p = buffer(BufferRole::kGathered, r_l * t, n_tp);
      gather_shards_into(u, 0, tp, compute, ws, p);
      for (int j = 0; j < t; ++j)
        ids_of(j, g_rank * r_l, r_l, ids);
      orthogonalize_classes(p, ids, layout, {&gtp, GramSide::kCols}, ns, scale, compute, ws);
      compute.copy(p.block(t_rank * r_l, 0, r_l, n_tp), u);
    } else {
      const MatrixView p = buffer(BufferRole::kGathered, r_l, n_tp * t);
      gather_shards_into(u, 1, tp, compute, ws, p);
      ids_of(t_rank, g_rank * r_l, r_l, ids);
      orthogonalize_classes(p, ids, layout, {&gtp, GramSide::kCols}, ns, scale, compute, ws);
      compute.copy(p.block(0, t_rank * n_tp, r_l, n_tp), u);
    }
    return;
  }
  if (tp_on && gtp_on) {
    // TP larger: gather over GTP into the TP-local tensor, distribute over TP.
    const MatrixView p = buffer(BufferRole::kGathered, r_tp, n_tp);
    gather_shards_into(u, 0, gtp, compute, ws, p);
    ids_of(t_rank, 0, r_tp, ids);
    orthogonalize_classes(p, ids, layout, {&tp, tp_side}, ns, scale, compute, ws);
    compute.copy(p.block(g_rank * r_l, 0, r_l, n_tp), u);
    return;
  }
  ids_of(t_rank, g_rank * r_l, r_l, ids);
  if (over_gtp) {
    orthogonalize_classes(u, ids, layout, {&gtp, GramSide::kCols}, ns, scale, compute, ws);
  } else {
    orthogonalize_classes(u, ids, layout, {&tp, tp_side}, ns, scale, compute, ws);
  }
}

}  // namespace detail

void orthogonalize_shard(MatrixView u, const ShardLayout& layout, const Communicator& tp,
                         const Communicator& gtp, TpMode mode, const NsOptions& ns,
                         const ScaleFn& scale, Compute& compute) {
  detail::orthogonalize_shard(u, layout, tp, gtp, mode, ns, scale, compute, nullptr);
}

}  // namespace distmuon
