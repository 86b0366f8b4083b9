// Row sharding of weights over a group: all-gather before use, reduce-scatter of gradients.
#include "distmuon/fsdp.h"

#include <fmt/format.h>

#include <algorithm>

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
  group.agree_or_throw(reason.empty(), op, reason);
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

void all_gather_rows(ConstMatrixView shard, const RowSharding& s, const Communicator& group,
                     MatrixView full, ShardingWorkspace& ws) {
  check_layout("all_gather_rows", shard, full, s, group);
  const std::size_t count = static_cast<std::size_t>(shard.size());
  if (s.pad_length == 0 && full.contiguous()) {
    group.all_gather<float>({shard.data, count},
                            {full.data, count * static_cast<std::size_t>(s.group_size)});
    return;
  }
  ws.padded.resize(count * static_cast<std::size_t>(s.group_size));
  group.all_gather<float>({shard.data, count}, ws.padded);
  copy(ConstMatrixView{ws.padded.data(), s.rows, s.cols, s.cols}, full);
}

void reduce_scatter_rows_mean(ConstMatrixView full, const RowSharding& s, const Communicator& group,
                              MatrixView shard, ShardingWorkspace& ws) {
  check_layout("reduce_scatter_rows_mean", shard, full, s, group);
  const std::size_t count = static_cast<std::size_t>(shard.size());
  const float* send = full.data;
  if (s.pad_length != 0 || !full.contiguous()) {
    ws.padded.assign(count * static_cast<std::size_t>(s.group_size), 0.0f);
    copy(full, MatrixView{ws.padded.data(), s.rows, s.cols, s.cols});
    send = ws.padded.data();
  }
  group.reduce_scatter<float>({send, count * static_cast<std::size_t>(s.group_size)},
                              {shard.data, count});
  const float inv = 1.0f / static_cast<float>(s.group_size);
  for (std::size_t i = 0; i < count; ++i)
    shard.data[i] *= inv;
}

void all_reduce_mean(MatrixView m, const Communicator& group) {
  std::string reason;
  if (!m.contiguous())
    reason = fmt::format("matrix {} with ld {} is not contiguous", shape_str(m.rows, m.cols), m.ld);
  group.agree_or_throw(reason.empty(), "all_reduce_mean", reason);
  group.all_reduce<float>({m.data, static_cast<std::size_t>(m.size())});
  const float inv = 1.0f / static_cast<float>(group.size());
  for (Index i = 0; i < m.size(); ++i)
    m.data[i] *= inv;
}

}  // namespace distmuon
