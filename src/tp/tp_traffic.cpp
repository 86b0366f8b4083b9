// Closed-form traffic and FLOPs of newton_schulz_tp, shared by tests, the bench and the cost model.
#include <fmt/format.h>

#include "distmuon/error.h"
#include "distmuon/tp_traffic.h"

namespace distmuon {
namespace {

void check_args(const char* what, Index m, Index n, int group_size, int partition_dim,
                TpMode mode) {
  if (m < 0 || n < 0 || group_size < 1) {
    throw Error(
        fmt::format("{}: invalid matrix {} or group size {}", what, shape_str(m, n), group_size));
  }
  if (partition_dim != kNoPartition && partition_dim != 0 && partition_dim != 1) {
    throw Error(fmt::format("{}: partition dim {} (valid: none, 0, 1)", what, partition_dim));
  }
  if (mode == TpMode::kAuto)
    throw Error(fmt::format("{}: tp_mode auto must be resolved first", what));
  if (mode == TpMode::kOwner) {
    throw Error(
        fmt::format("{}: tp_mode owner is a mode of a list of weights, not of one matrix", what));
  }
  const Index extent = partition_dim == 0 ? m : n;
  if (partition_dim != kNoPartition && extent % group_size != 0) {
    throw Error(fmt::format("{}: {} does not split into {} equal shards along dim {}", what,
                            shape_str(m, n), group_size, partition_dim));
  }
}

bool communicates(int group_size, int partition_dim, TpMode mode) {
  return group_size > 1 && partition_dim != kNoPartition && mode != TpMode::kBlockwise;
}

// Distributed traffic with gram_matrices all-reduces of the s x s Gram matrix.
TpTraffic traffic(Index m, Index n, int group_size, int partition_dim, TpMode mode,
                  int gram_matrices, int elem_size) {
  TpTraffic t;
  if (!communicates(group_size, partition_dim, mode)) return t;
  const auto es = static_cast<std::size_t>(elem_size);
  if (mode == TpMode::kDuplicated) {
    t.all_gather_calls = 1;
    t.all_gather_bytes = static_cast<std::size_t>(m) * static_cast<std::size_t>(n) * es;
    return t;
  }
  const auto s = static_cast<std::size_t>(partition_dim == 0 ? n : m);
  t.all_reduce_calls = static_cast<std::size_t>(gram_matrices) + 1;
  t.all_reduce_bytes = static_cast<std::size_t>(gram_matrices) * s * s * es + sizeof(double);
  return t;
}

void check_traffic_args(Index m, Index n, int group_size, int partition_dim, TpMode mode, int steps,
                        int elem_size) {
  check_args("tp_traffic", m, n, group_size, partition_dim, mode);
  if (steps < 0 || elem_size < 1) {
    throw Error(fmt::format("tp_traffic: invalid steps {} or element size {}", steps, elem_size));
  }
}

}  // namespace

TpTraffic tp_traffic(Index m, Index n, int group_size, int partition_dim, TpMode mode, int steps,
                     int elem_size) {
  check_traffic_args(m, n, group_size, partition_dim, mode, steps, elem_size);
  return traffic(m, n, group_size, partition_dim, mode, steps, elem_size);
}

TpTraffic tp_traffic(Index m, Index n, int group_size, int partition_dim, TpMode mode,
                     const NsOptions& opts, int elem_size) {
  check_traffic_args(m, n, group_size, partition_dim, mode, opts.steps, elem_size);
  // The aol set's input scaling all-reduces one more Gram matrix (gram_ns_gram_count counts it).
  const bool aol = opts.coefficients.input_scaling == CoefficientSet::InputScaling::kAol;
  const int grams =
      opts.algorithm == NsAlgorithm::kGram ? gram_ns_gram_count(opts) : opts.steps + (aol ? 1 : 0);
  return traffic(m, n, group_size, partition_dim, mode, grams, elem_size);
}

TpLocalNs tp_local_ns(Index m, Index n, int group_size, int partition_dim, TpMode mode,
                      GramSide requested) {
  check_args("tp_local_ns", m, n, group_size, partition_dim, mode);
  const auto resolve = [requested](Index rows, Index cols) {
    if (requested != GramSide::kAuto) return requested;
    return rows <= cols ? GramSide::kRows : GramSide::kCols;
  };
  // Unsharded or a group of one: the local NS of the whole matrix, whatever the mode.
  if (partition_dim == kNoPartition || group_size == 1 || mode == TpMode::kDuplicated) {
    return {m, n, resolve(m, n)};
  }
  const Index sm = partition_dim == 0 ? m / group_size : m;
  const Index sn = partition_dim == 1 ? n / group_size : n;
  if (mode == TpMode::kBlockwise) return {sm, sn, resolve(sm, sn)};
  return {sm, sn, partition_dim == 0 ? GramSide::kCols : GramSide::kRows};
}

double tp_flops(Index m, Index n, int group_size, int partition_dim, TpMode mode,
                const NsOptions& opts) {
  const TpLocalNs local = tp_local_ns(m, n, group_size, partition_dim, mode, opts.side);
  NsOptions o = opts;
  o.side = local.side;
  return ns_flops(local.rows, local.cols, o);
}

}  // namespace distmuon
