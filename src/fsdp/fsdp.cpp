// Row sharding of weights over a group: all-gather before use, reduce-scatter of gradients.
#include "distmuon/fsdp.h"

#include <fmt/format.h>

#include <algorithm>

#include "distmuon/agreement.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

// Checks on every rank together that the buffers fit the sharding and the group.
void check_layout(const char* op, ConstMatrixView shard, ConstMatrixView full, const RowSharding& s,
                  const Communicator& group) {
  std::string reason;
  if (s.group_size != group.size()) {
    reason = fmt::format("sharding for {} ranks used on a group of {}", s.group_size, group.size());
  } else if (shard.rows != s.shard_rows || shard.cols != s.cols || !shard.contiguous()) {
    reason = fmt::format("shard {} (ld {}) is not the contiguous {} shard of {} over {} ranks",
                         shape_str(shard), shard.ld, shape_str(s.shard_rows, s.cols),
                         shape_str(s.rows, s.cols), s.group_size);
  } else if (full.rows != s.rows || full.cols != s.cols) {
    reason = fmt::format("full matrix {} is not the sharded {}", shape_str(full),
                         shape_str(s.rows, s.cols));
  }
  agree_or_throw(group, reason.empty(), op, reason);
}

}  // namespace

RowSharding RowSharding::make(Index rows, Index cols, int group_size) {
  if (rows < 0 || cols < 0 || group_size < 1) {
    throw Error(fmt::format("row sharding of {} over {} ranks: negative shape or empty group",
                            shape_str(rows, cols), group_size));
  }
  RowSharding s;
  s.rows = rows;
  s.cols = cols;
  s.group_size = group_size;
  s.shard_rows = (rows + group_size - 1) / group_size;
  s.pad_length = s.shard_rows * group_size - rows;
  return s;
}

Index RowSharding::real_rows(int rank) const {
  return std::clamp<Index>(rows - first_row(rank), 0, shard_rows);
}

Matrix row_shard(ConstMatrixView full, const RowSharding& s, int rank) {
  if (full.rows != s.rows || full.cols != s.cols || rank < 0 || rank >= s.group_size) {
    throw Error(fmt::format("row_shard: rank {} of {} of a {} matrix sharded as {}", rank,
                            s.group_size, shape_str(full), shape_str(s.rows, s.cols)));
  }
  Matrix out(s.shard_rows, s.cols);
  const Index real = s.real_rows(rank);
  if (real > 0) copy(full.row_block(s.first_row(rank), real), out.view().row_block(0, real));
  return out;
}

namespace {

// The data plane that moves compute's memory over group.
Communicator data_plane(const Communicator& group, Compute& compute) {
  return (group.has_data_plane() ? group : compute.data_communicator(group)).data();
}

}  // namespace

void all_gather_rows(ConstMatrixView shard, const RowSharding& s, const Communicator& group,
                     MatrixView full, ShardingWorkspace& ws, Compute& compute) {
  check_layout("all_gather_rows", shard, full, s, group);
  const Communicator data = data_plane(group, compute);
  const std::size_t count = static_cast<std::size_t>(shard.size());
  const std::size_t total = count * static_cast<std::size_t>(s.group_size);
  if (s.pad_length == 0 && full.contiguous()) {
    data.all_gather<float>({shard.data, count}, {full.data, total});
    return;
  }
  ws.padded.ensure(compute, s.shard_rows * s.group_size, s.cols);
  data.all_gather<float>({shard.data, count}, {ws.padded.view().data, total});
  compute.copy(ws.padded.view().row_block(0, s.rows), full);
}

void reduce_scatter_rows_mean(ConstMatrixView full, const RowSharding& s, const Communicator& group,
                              MatrixView shard, ShardingWorkspace& ws, Compute& compute) {
  check_layout("reduce_scatter_rows_mean", shard, full, s, group);
  const Communicator data = data_plane(group, compute);
  const std::size_t count = static_cast<std::size_t>(shard.size());
  const float* send = full.data;
  if (s.pad_length != 0 || !full.contiguous()) {
    ws.padded.ensure(compute, s.shard_rows * s.group_size, s.cols);
    const MatrixView padded = ws.padded.view();
    compute.copy(full, padded.row_block(0, s.rows));
    if (s.pad_length > 0) compute.fill(padded.row_block(s.rows, s.pad_length), 0.0f);
    send = padded.data;
  }
  data.reduce_scatter<float>({send, count * static_cast<std::size_t>(s.group_size)},
                             {shard.data, count});
  compute.scale(shard, 1.0f / static_cast<float>(s.group_size));
}

void all_reduce_mean(MatrixView m, const Communicator& group, Compute& compute) {
  std::string reason;
  if (!m.contiguous())
    reason = fmt::format("matrix {} with ld {} is not contiguous", shape_str(m.rows, m.cols), m.ld);
  agree_or_throw(group, reason.empty(), "all_reduce_mean", reason);
  data_plane(group, compute).all_reduce<float>({m.data, static_cast<std::size_t>(m.size())});
  compute.scale(m, 1.0f / static_cast<float>(group.size()));
}

}  // namespace distmuon
