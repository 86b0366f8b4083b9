#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <memory>

#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/layout.h"
#include "distmuon/tp.h"
#include "tp/sharded_ns.h"

namespace distmuon {
namespace {

// An agreement on the shard shape runs on every call (one all-reduce of three 64-bit integers,
// negligible next to NS); a mismatch throws CollectiveError on every rank, naming the first rank
// that differs from rank 0. It is not cached: a cache keyed on this rank's own shape would skip the
// agreement on a rank whose shape was verified earlier while another rank, holding a new shape,
// enters it, which is a hang instead of an error.
void check_equal_shards(const Communicator& group, Index rows, Index cols, int partition_dim) {
  using Shape = std::array<std::int64_t, 3>;
  const Shape mine = {rows, cols, partition_dim};
  agree_on(group, {reinterpret_cast<const char*>(mine.data()), sizeof(Shape)},
           fmt::format("newton_schulz_tp over a group of {}", group.size()),
           [&](std::string_view root_bytes, std::string_view) {
             Shape root{};
             std::copy_n(root_bytes.data(), sizeof(Shape), reinterpret_cast<char*>(root.data()));
             return fmt::format("shards differ: rank 0 holds {} dim {}, rank {} holds {} dim {}",
                                shape_str(root[0], root[1]), root[2], group.rank(),
                                shape_str(rows, cols), partition_dim);
           });
}

}  // namespace

Matrix shard_of(ConstMatrixView full, int dim, int parts, int index) {
  if (dim != 0 && dim != 1)
    throw Error(fmt::format("shard_of: partition dim must be 0 or 1, got {}", dim));
  const Index extent = dim == 0 ? full.rows : full.cols;
  if (parts < 1 || index < 0 || index >= parts || extent % parts != 0) {
    throw Error(fmt::format("shard_of: cannot split {} into {} equal parts along dim {} (part {})",
                            shape_str(full), parts, dim, index));
  }
  const Index n = extent / parts;
  return Matrix::from(dim == 0 ? full.block(n * index, 0, n, full.cols)
                               : full.block(0, n * index, full.rows, n));
}

namespace detail {

void gather_shards_into(ConstMatrixView shard, int dim, const Communicator& group, Compute& compute,
                        NsWorkspaces& ws, MatrixView full) {
  const int g = group.size();
  DISTMUON_ASSERT(dim == 0 || dim == 1, "gather dim");
  DISTMUON_ASSERT(full.contiguous() && full.rows == (dim == 0 ? shard.rows * g : shard.rows) &&
                      full.cols == (dim == 0 ? shard.cols : shard.cols * g),
                  "gathered shape");
  const float* send = shard.data;
  if (!shard.contiguous()) {
    DeviceMatrix& c = ws.buffer(compute, BufferRole::kStaging, 1, shard.rows, shard.cols);
    compute.copy(shard, c.view());
    send = c.view().data;
  }
  const auto count = static_cast<std::size_t>(shard.size());
  const Communicator data = group.data();
  if (dim == 0) {
    data.all_gather<float>({send, count}, {full.data, count * static_cast<std::size_t>(g)});
    return;
  }
  // Columns: gather shards back to back, then interleave them (one copy per rank).
  DeviceMatrix& stacked = ws.buffer(compute, BufferRole::kStaging, 0, shard.rows * g, shard.cols);
  data.all_gather<float>({send, count}, {stacked.view().data, count * static_cast<std::size_t>(g)});
  for (int r = 0; r < g; ++r) {
    compute.copy(stacked.view().row_block(shard.rows * r, shard.rows),
                 full.block(0, shard.cols * r, shard.rows, shard.cols));
  }
}

void gather_batch_into(std::span<const MatrixView> shards, int dim, const Communicator& group,
                       Compute& compute, NsWorkspaces& ws, std::span<const MatrixView> fulls) {
  DISTMUON_ASSERT(shards.size() == fulls.size() && !shards.empty(), "one full matrix per shard");
  if (shards.size() == 1) {
    gather_shards_into(shards[0], dim, group, compute, ws, fulls[0]);
    return;
  }
  const int g = group.size();
  const auto b = static_cast<Index>(shards.size());
  const Index rows = shards[0].rows, cols = shards[0].cols;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    DISTMUON_ASSERT(shards[i].rows == rows && shards[i].cols == cols, "equal shards");
    DISTMUON_ASSERT(fulls[i].rows == (dim == 0 ? rows * g : rows) &&
                        fulls[i].cols == (dim == 0 ? cols : cols * g),
                    "gathered shape");
  }
  // The shards back to back (as a batched parameter's slices lie), else staged so.
  const auto count = static_cast<std::size_t>(b * rows * cols);
  const float* send = shards[0].data;
  bool back_to_back = true;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    back_to_back = back_to_back && shards[i].contiguous() &&
                   shards[i].data == shards[0].data + static_cast<Index>(i) * rows * cols;
  }
  if (!back_to_back) {
    const MatrixView staged = ws.buffer(compute, BufferRole::kStaging, 3, b * rows, cols).view();
    for (std::size_t i = 0; i < shards.size(); ++i)
      compute.copy(shards[i], staged.row_block(static_cast<Index>(i) * rows, rows));
    send = staged.data;
  }
  // Rank r's block holds its shard of every matrix in turn: shard i of rank r goes to matrix
  // i's rows (dim 0) or columns (dim 1) of rank r.
  const MatrixView recv = ws.buffer(compute, BufferRole::kStaging, 2, g * b * rows, cols).view();
  group.data().all_gather<float>({send, count}, {recv.data, count * static_cast<std::size_t>(g)});
  for (Index r = 0; r < g; ++r) {
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const ConstMatrixView from = recv.row_block((r * b + static_cast<Index>(i)) * rows, rows);
      compute.copy(from, dim == 0 ? fulls[i].row_block(r * rows, rows)
                                  : fulls[i].block(0, r * cols, rows, cols));
    }
  }
}

}  // namespace detail

DeviceMatrix all_gather_shards(ConstMatrixView shard, int dim, const Communicator& group,
                               Compute& compute) {
  if (dim != 0 && dim != 1)
    throw Error(fmt::format("all_gather_shards: dim must be 0 or 1, got {}", dim));
  const int g = group.size();
  DeviceMatrix full(compute, dim == 0 ? shard.rows * g : shard.rows,
                    dim == 0 ? shard.cols : shard.cols * g);
  detail::NsWorkspaces ws;
  detail::gather_shards_into(shard, dim, group, compute, ws, full.view());
  return full;
}

Matrix unshard(const std::vector<Matrix>& shards, int dim) {
  if (shards.empty()) throw Error("unshard: no shards");
  const Index r = shards[0].rows(), c = shards[0].cols();
  const auto g = static_cast<Index>(shards.size());
  Matrix full(dim == 0 ? r * g : r, dim == 0 ? c : c * g);
  for (Index i = 0; i < g; ++i) {
    const Matrix& s = shards[static_cast<std::size_t>(i)];
    if (s.rows() != r || s.cols() != c) throw Error("unshard: shards differ in shape");
    copy(s.view(),
         dim == 0 ? full.view().block(r * i, 0, r, c) : full.view().block(0, c * i, r, c));
  }
  return full;
}

void newton_schulz_tp(MatrixView shard, int partition_dim, const Communicator& group, TpMode mode,
                      const NsOptions& opts, Compute& compute) {
  if (mode == TpMode::kAuto)
    throw Error("newton_schulz_tp: tp_mode auto must be resolved before the call");
  if (mode == TpMode::kOwner) {
    throw Error(
        "newton_schulz_tp: tp_mode owner orthogonalises a list of weights (Muon), not one matrix");
  }
  if (partition_dim != kNoPartition && partition_dim != 0 && partition_dim != 1) {
    throw Error(
        fmt::format("newton_schulz_tp: partition dim {} (valid: none, 0, 1)", partition_dim));
  }
  const bool sharded = partition_dim != kNoPartition && group.size() > 1;
  if (sharded && mode != TpMode::kBlockwise)
    check_equal_shards(group, shard.rows, shard.cols, partition_dim);
  // One group holding equal shards, no padding, no QKV split, no scaling: the dispatcher's
  // TP-only case (the group is the TP group; the GTP group is this rank alone).
  const ShardLayout layout =
      group_layout(shard.rows, shard.cols, partition_dim, group.size(), group.rank());
  // The shards move over the group's data plane: attach the backend's when it has none yet.
  const Communicator tp = group.has_data_plane() ? group : compute.data_communicator(group);
  // Blockwise, each rank's NS is its own (no collective inside): a rank-local refusal is agreed
  // below instead of leaving the other ranks waiting.
  std::string reason;
  if (sharded && mode == TpMode::kBlockwise) {
    try {
      orthogonalize_shard(shard, layout, tp, local_communicator(), mode, opts, {}, compute);
    } catch (const CollectiveError&) {
      throw;
    } catch (const Error& e) {
      reason = e.what();
    }
  } else {
    orthogonalize_shard(shard, layout, tp, local_communicator(), mode, opts, {}, compute);
  }
  // The result is checked on every backend, so that no caller (the CLI, Python) is handed a
  // non-finite result: every backend leaves a non-finite input's result NaN (NormCheck::kBackend),
  // and the checked schedule (NsOptions::validate) keeps a finite input's result finite.
  const std::optional<MatrixIndex> at =
      reason.empty() ? compute.find_non_finite(shard) : std::nullopt;
  if (at) {
    reason = fmt::format(
        "input shard {} (rank {}) contains non-finite values (or its norm overflows): the result "
        "is not finite at ({}, {}) (checked after the iteration on the {} backend)",
        shape_str(shard), group.rank(), at->row, at->col, compute.name());
  }
  // A sharded call agrees (its ranks hold parts of one result); an unsharded one is rank-local.
  if (sharded) {
    agree_or_throw(group, reason.empty(), "newton_schulz_tp", reason);
  } else if (!reason.empty()) {
    throw Error("newton_schulz_tp: " + reason);
  }
}

ProcessGroups make_process_groups(const Communicator& world, int tp_size, int gtp_size) {
  const int w = world.size();
  if (tp_size < 1 || gtp_size < 1 || w % (tp_size * gtp_size) != 0) {
    throw Error(fmt::format("process groups: world of {} ranks is not a multiple of TP {} x GTP {}",
                            w, tp_size, gtp_size));
  }
  const int r = world.rank();
  const int tp_rank = r % tp_size;
  const int gtp_rank = (r / tp_size) % gtp_size;
  const int replica = r / (tp_size * gtp_size);
  ProcessGroups g{world,
                  world.split(gtp_rank + gtp_size * replica, tp_rank),
                  world.split(tp_rank + tp_size * replica, gtp_rank),
                  world.split(tp_rank, r),
                  tp_size,
                  gtp_size,
                  w / (tp_size * gtp_size)};
  return g;
}

}  // namespace distmuon
