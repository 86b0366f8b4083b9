#include <fmt/format.h>

#include <array>
#include <cstring>
#include <memory>

#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/layout.h"
#include "distmuon/tp.h"

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
             std::memcpy(root.data(), root_bytes.data(), sizeof(Shape));
             return fmt::format("shards differ: rank 0 holds {} dim {}, rank {} holds {} dim {}",
                                shape_str(root[0], root[1]), root[2], group.rank(),
                                shape_str(rows, cols), partition_dim);
           });
}

}  // namespace

Matrix shard_of(ConstMatrixView full, int dim, int parts, int index, Compute& compute) {
  if (dim != 0 && dim != 1)
    throw Error(fmt::format("shard_of: partition dim must be 0 or 1, got {}", dim));
  const Index extent = dim == 0 ? full.rows : full.cols;
  if (parts < 1 || index < 0 || index >= parts || extent % parts != 0) {
    throw Error(fmt::format("shard_of: cannot split {} into {} equal parts along dim {} (part {})",
                            shape_str(full), parts, dim, index));
  }
  const Index n = extent / parts;
  const ConstMatrixView part =
      dim == 0 ? full.block(n * index, 0, n, full.cols) : full.block(0, n * index, full.rows, n);
  Matrix out(part.rows, part.cols);
  compute.copy(part, out.view());
  return out;
}

Matrix all_gather_shards(ConstMatrixView shard, int dim, const Communicator& group,
                         Compute& compute) {
  const int g = group.size();
  Matrix contiguous;
  if (!shard.contiguous()) {
    contiguous = Matrix(shard.rows, shard.cols);
    compute.copy(shard, contiguous.view());
  }
  const float* send = shard.contiguous() ? shard.data : contiguous.data();
  const auto count = static_cast<std::size_t>(shard.size());
  if (dim == 0) {
    Matrix full(shard.rows * g, shard.cols);
    group.all_gather<float>({send, count}, full.values());
    return full;
  }
  // Columns: gather shards back to back, then interleave their rows.
  std::vector<float> stacked(count * static_cast<std::size_t>(g));
  group.all_gather<float>({send, count}, stacked);
  Matrix full(shard.rows, shard.cols * g);
  for (int r = 0; r < g; ++r) {
    const ConstMatrixView piece{stacked.data() + count * static_cast<std::size_t>(r), shard.rows,
                                shard.cols, shard.cols};
    compute.copy(piece, full.view().block(0, shard.cols * r, shard.rows, shard.cols));
  }
  return full;
}

Matrix unshard(const std::vector<Matrix>& shards, int dim, Compute& compute) {
  if (shards.empty()) throw Error("unshard: no shards");
  const Index r = shards[0].rows(), c = shards[0].cols();
  const auto g = static_cast<Index>(shards.size());
  Matrix full(dim == 0 ? r * g : r, dim == 0 ? c : c * g);
  for (Index i = 0; i < g; ++i) {
    const Matrix& s = shards[static_cast<std::size_t>(i)];
    if (s.rows() != r || s.cols() != c) throw Error("unshard: shards differ in shape");
    compute.copy(s.view(),
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
  orthogonalize_shard(shard, layout, group, local_communicator(), mode, opts, {}, compute);
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
