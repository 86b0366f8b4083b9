// The layout arithmetic of a sharded weight (layout.h).
#include "distmuon/layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "distmuon/error.h"

namespace distmuon {

Index ShardLayout::local_pad() const {
  const Index r = shard_rows();
  return std::min(r, std::max<Index>(0, pad - (gtp_size - 1 - gtp_rank) * r));
}

Index ShardLayout::global_row(int t, Index i) const {
  if (i >= m_tp()) return -1;
  const Index row = tp_dim == 0 ? t * m_tp() + i : i;
  return row < m ? row : -1;
}

Index ShardLayout::tp_cols(int t) const {
  if (tp_dim != 1) return n_tp();
  return std::clamp<Index>(n - t * n_tp(), 0, n_tp());
}

int ShardLayout::row_class(Index global_row) const {
  if (qkv.empty()) return 0;
  const Index period = std::accumulate(qkv.begin(), qkv.end(), Index{0});
  Index within = global_row % period;
  for (std::size_t c = 0; c < qkv.size(); ++c) {
    if (within < qkv[c]) return static_cast<int>(c);
    within -= qkv[c];
  }
  DISTMUON_ASSERT(false, "row outside its query group");
}

Index ShardLayout::class_rows(int c) const {
  if (qkv.empty()) return m;
  const Index period = std::accumulate(qkv.begin(), qkv.end(), Index{0});
  return m / period * qkv[static_cast<std::size_t>(c)];
}

void ShardLayout::validate(const std::string& what) const {
  auto fail = [&](const std::string& why) { throw Error(fmt::format("{}: {}", what, why)); };
  if (m < 1 || n < 1) fail(fmt::format("shape {} must be positive", shape_str(m, n)));
  if (tp_dim != kNoPartition && tp_dim != 0 && tp_dim != 1) {
    fail(fmt::format("TP partition dim {} (valid: none, 0, 1)", tp_dim));
  }
  const Index extent = tp_dim == 0 ? m : n;
  if (tp_pad < 0) fail(fmt::format("TP pad {} is negative", tp_pad));
  if (tp_pad > 0 && !tp_on()) fail(fmt::format("TP pad {} without a TP split", tp_pad));
  if (tp_dim != kNoPartition && (extent + tp_pad) % tp_size != 0) {
    fail(fmt::format("{} with TP pad {} does not split into {} equal TP shards along dim {}",
                     shape_str(m, n), tp_pad, tp_size, tp_dim));
  }
  if (pad < 0) fail(fmt::format("pad_length {} is negative", pad));
  if (batch < 1) {
    fail(fmt::format("batch {} (the matrices stacked in the parameter) must be at least 1", batch));
  }
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    fail(fmt::format("replica {} of {} (a data-parallel group of at least one rank)", dp_rank,
                     dp_size));
  }
  if (padded_rows() % gtp_size != 0) {
    fail(fmt::format("{} TP-local rows plus pad_length {} do not split into {} equal GTP shards",
                     m_tp(), pad, gtp_size));
  }
  if (!qkv.empty()) {
    if (qkv.size() != 3 && qkv.size() != 4) {
      fail(fmt::format(
          "QKV split needs 3 ({{q, k, v}}) or 4 ({{q, gate, k, v}}) block sizes, got {}",
          qkv.size()));
    }
    for (Index b : qkv) {
      if (b < 1)
        fail(fmt::format("QKV block sizes must be positive, got [{}]", fmt::join(qkv, ", ")));
    }
    const Index period = std::accumulate(qkv.begin(), qkv.end(), Index{0});
    if (m % period != 0) {
      fail(fmt::format("{} rows are not whole query groups of [{}] = {} rows", m,
                       fmt::join(qkv, ", "), period));
    }
  }
}

ShardLayout group_layout(Index shard_rows, Index shard_cols, int partition_dim, int group_size,
                         int rank) {
  ShardLayout l{.m = shard_rows, .n = shard_cols};
  if (partition_dim == kNoPartition || group_size <= 1) return l;
  l.tp_dim = partition_dim;
  l.tp_size = group_size;
  l.tp_rank = rank;
  (partition_dim == 0 ? l.m : l.n) *= group_size;
  return l;
}

bool distributes_over_gtp(const ShardLayout& layout) {
  if (!layout.gtp_on()) return false;
  return !layout.tp_on() || layout.gtp_size >= layout.tp_size;  // a tie distributes over GTP
}

}  // namespace distmuon
