#include "optim/owner_ns.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "distmuon/agreement.h"
#include "distmuon/checkpoint.h"
#include "distmuon/error.h"

namespace distmuon::detail {
namespace {

bool tp_on(const ShardLayout& l) {
  return l.tp_dim != kNoPartition && l.tp_size > 1;
}
bool sharded(const ShardLayout& l) {
  return tp_on(l) || l.gtp_size > 1;
}
std::size_t elems(Index rows, Index cols) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
}

// Copies a (strided) view into a contiguous buffer, and back.
float* pack_into(Compute& compute, ConstMatrixView v, float* out) {
  compute.copy(v, MatrixView{out, v.rows, v.cols, v.cols});
  return out + elems(v.rows, v.cols);
}
const float* unpack_from(Compute& compute, const float* in, MatrixView v) {
  compute.copy(ConstMatrixView{in, v.rows, v.cols, v.cols}, v);
  return in + elems(v.rows, v.cols);
}

// The bucket's grid: T x G ranks, this rank at (t, g).
struct Grid {
  int T = 1, G = 1, t = 0, g = 0;
  int t_of(int owner) const { return owner % T; }
  int g_of(int owner) const { return owner / T; }
  int me() const { return t + T * g; }
};

Grid grid_of(const ShardLayout& l) {
  return {tp_on(l) ? l.tp_size : 1, l.gtp_size, tp_on(l) ? l.tp_rank : 0, l.gtp_rank};
}

// The TP block of rank j in a full work matrix.
MatrixView tp_block(MatrixView full, const ShardLayout& l, int j) {
  const Index r_tp = l.padded_rows(), n_tp = l.n_tp();
  return l.tp_dim == 0 ? full.block(j * r_tp, 0, r_tp, n_tp) : full.block(0, j * n_tp, r_tp, n_tp);
}

// A one-line description of a layout (rank fields excluded): the composition key of a bucket.
std::string describe(const ShardLayout& l) {
  return fmt::format("{}x{}:tp{}/{}:gtp{}:pad{}:qkv{}", l.m, l.n, l.tp_dim,
                     tp_on(l) ? l.tp_size : 1, l.gtp_size, l.pad, fmt::join(l.qkv, ","));
}

}  // namespace

OwnerCostFn ns_flops_cost(const NsOptions& ns) {
  return [ns](const ShardLayout& l, NsAlgorithm algorithm) {
    NsOptions o = ns;
    o.side = GramSide::kAuto;
    o.algorithm = algorithm;
    return ns_flops(l.m, l.n, o);
  };
}

void orthogonalize_owned(std::span<const OwnerItem> items, std::span<const int> owners,
                         const Communicator& tp, const Communicator& gtp, const NsOptions& ns,
                         const ScaleFn& scale, Compute& compute, NsWorkspaces* workspaces) {
  DISTMUON_ASSERT(items.size() == owners.size(), "one owner per item");
  if (items.empty()) return;
  const Grid grid = grid_of(*items.front().layout);
  DISTMUON_ASSERT(grid.T == 1 || tp.size() == grid.T, "TP group size");
  DISTMUON_ASSERT(grid.G == 1 || gtp.size() == grid.G, "GTP group size");
  const std::size_t n_items = items.size();
  auto layout = [&](std::size_t i) -> const ShardLayout& { return *items[i].layout; };
  auto shard_elems = [&](std::size_t i) { return elems(layout(i).shard_rows(), layout(i).n_tp()); };
  auto local_elems = [&](std::size_t i) {
    return elems(layout(i).padded_rows(), layout(i).n_tp());
  };

  // Stage 1 (gather over GTP): TP-local tensors of the weights whose owner sits in this rank's
  // GTP row (g_o == g). Without GTP the shard is the TP-local tensor.
  std::vector<Matrix> tp_local(n_items);
  std::vector<float> send, recv;
  const auto G = static_cast<std::size_t>(grid.G), T = static_cast<std::size_t>(grid.T);
  std::vector<std::size_t> send_counts, recv_counts;
  if (grid.G > 1) {
    send_counts.assign(G, 0);
    recv_counts.assign(G, 0);
    for (std::size_t i = 0; i < n_items; ++i) {
      send_counts[static_cast<std::size_t>(grid.g_of(owners[i]))] += shard_elems(i);
      if (grid.g_of(owners[i]) == grid.g) {
        for (std::size_t j = 0; j < G; ++j)
          recv_counts[j] += shard_elems(i);
      }
    }
    send.resize(std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0}));
    recv.resize(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
    float* out = send.data();
    for (std::size_t j = 0; j < G; ++j) {
      for (std::size_t i = 0; i < n_items; ++i) {
        if (static_cast<std::size_t>(grid.g_of(owners[i])) == j)
          out = pack_into(compute, items[i].shard, out);
      }
    }
    gtp.all_to_all_v<float>(send, send_counts, recv, recv_counts);
    const float* in = recv.data();
    for (std::size_t j = 0; j < G; ++j) {
      for (std::size_t i = 0; i < n_items; ++i) {
        if (grid.g_of(owners[i]) != grid.g) continue;
        const ShardLayout& l = layout(i);
        if (tp_local[i].rows() == 0) tp_local[i] = Matrix(l.padded_rows(), l.n_tp());
        in = unpack_from(
            compute, in,
            tp_local[i].view().row_block(static_cast<Index>(j) * l.shard_rows(), l.shard_rows()));
      }
    }
  } else {
    for (std::size_t i = 0; i < n_items; ++i) {
      tp_local[i] = Matrix(items[i].shard.rows, items[i].shard.cols);
      compute.copy(items[i].shard, tp_local[i].view());
    }
  }

  // Stage 2 (gather over TP): the owner's full work matrices.
  std::vector<Matrix> full(n_items);
  auto mine = [&](std::size_t i) { return owners[i] == grid.me(); };
  auto in_row = [&](std::size_t i) { return grid.g_of(owners[i]) == grid.g; };
  if (grid.T > 1) {
    send_counts.assign(T, 0);
    recv_counts.assign(T, 0);
    for (std::size_t i = 0; i < n_items; ++i) {
      if (!in_row(i)) continue;
      send_counts[static_cast<std::size_t>(grid.t_of(owners[i]))] += local_elems(i);
      if (mine(i)) {
        for (std::size_t j = 0; j < T; ++j)
          recv_counts[j] += local_elems(i);
      }
    }
    send.resize(std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0}));
    recv.resize(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
    float* out = send.data();
    for (std::size_t j = 0; j < T; ++j) {
      for (std::size_t i = 0; i < n_items; ++i) {
        if (in_row(i) && static_cast<std::size_t>(grid.t_of(owners[i])) == j)
          out = pack_into(compute, tp_local[i].view(), out);
      }
    }
    tp.all_to_all_v<float>(send, send_counts, recv, recv_counts);
    const float* in = recv.data();
    for (std::size_t j = 0; j < T; ++j) {
      for (std::size_t i = 0; i < n_items; ++i) {
        if (!mine(i)) continue;
        if (full[i].rows() == 0)
          full[i] = Matrix(full_work_rows(layout(i)), full_work_cols(layout(i)));
        in = unpack_from(compute, in, tp_block(full[i].view(), layout(i), static_cast<int>(j)));
      }
    }
  } else {
    for (std::size_t i = 0; i < n_items; ++i) {
      if (mine(i)) full[i] = std::move(tp_local[i]);
    }
  }

  // The owner's NS: the code duplicated mode runs on the same matrix.
  NsOptions gram = ns;
  gram.algorithm = NsAlgorithm::kGram;
  for (std::size_t i = 0; i < n_items; ++i) {
    if (!mine(i)) continue;
    orthogonalize_full(full[i].view(), layout(i),
                       items[i].algorithm == NsAlgorithm::kGram ? gram : ns, scale, compute,
                       workspaces);
  }

  // Scatter, stage 2 reversed: the owner sends TP rank j its TP-local block.
  if (grid.T > 1) {
    std::swap(send_counts, recv_counts);
    send.resize(std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0}));
    recv.resize(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
    float* out = send.data();
    for (std::size_t j = 0; j < T; ++j) {
      for (std::size_t i = 0; i < n_items; ++i) {
        if (mine(i))
          out = pack_into(compute, tp_block(full[i].view(), layout(i), static_cast<int>(j)), out);
      }
    }
    tp.all_to_all_v<float>(send, send_counts, recv, recv_counts);
    const float* in = recv.data();
    for (std::size_t j = 0; j < T; ++j) {
      for (std::size_t i = 0; i < n_items; ++i) {
        if (in_row(i) && static_cast<std::size_t>(grid.t_of(owners[i])) == j)
          in = unpack_from(compute, in, tp_local[i].view());
      }
    }
  } else {
    for (std::size_t i = 0; i < n_items; ++i) {
      if (mine(i)) tp_local[i] = std::move(full[i]);
    }
  }

  // Scatter, stage 1 reversed: rank (t, g_o) sends GTP rank j its row block.
  if (grid.G > 1) {
    send_counts.assign(G, 0);
    recv_counts.assign(G, 0);
    for (std::size_t i = 0; i < n_items; ++i) {
      recv_counts[static_cast<std::size_t>(grid.g_of(owners[i]))] += shard_elems(i);
      if (in_row(i)) {
        for (std::size_t j = 0; j < G; ++j)
          send_counts[j] += shard_elems(i);
      }
    }
    send.resize(std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0}));
    recv.resize(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
    float* out = send.data();
    for (std::size_t j = 0; j < G; ++j) {
      for (std::size_t i = 0; i < n_items; ++i) {
        if (!in_row(i)) continue;
        const Index r_l = layout(i).shard_rows();
        out =
            pack_into(compute, tp_local[i].view().row_block(static_cast<Index>(j) * r_l, r_l), out);
      }
    }
    gtp.all_to_all_v<float>(send, send_counts, recv, recv_counts);
    const float* in = recv.data();
    for (std::size_t j = 0; j < G; ++j) {
      for (std::size_t i = 0; i < n_items; ++i) {
        if (static_cast<std::size_t>(grid.g_of(owners[i])) == j)
          in = unpack_from(compute, in, items[i].shard);
      }
    }
  } else {
    for (std::size_t i = 0; i < n_items; ++i)
      compute.copy(tp_local[i].view(), items[i].shard);
  }
}

bool OwnerOrthogonalizer::KeyLess::operator()(const Key& a, const Key& b) const {
  const auto& [a_tp, a_gtp, a_s] = a;
  const auto& [b_tp, b_gtp, b_s] = b;
  if (a_tp.owner_before(b_tp)) return true;
  if (b_tp.owner_before(a_tp)) return false;
  if (a_gtp.owner_before(b_gtp)) return true;
  if (b_gtp.owner_before(a_gtp)) return false;
  return a_s < b_s;
}

const std::vector<int>& OwnerOrthogonalizer::owners_for(std::span<const OwnerItem> items,
                                                        const Communicator& tp,
                                                        const Communicator& gtp) {
  const ShardLayout& first = *items.front().layout;
  const Grid grid = grid_of(first);
  std::string composition = fmt::format("grid {}x{}", grid.T, grid.G);
  for (const OwnerItem& it : items)
    composition += fmt::format(";{}:{}", describe(*it.layout), to_string(it.algorithm));
  Key key{tp_on(first) ? tp.impl_ptr() : nullptr, first.gtp_size > 1 ? gtp.impl_ptr() : nullptr,
          composition};
  if (const auto it = cache_.find(key); it != cache_.end()) return it->second;

  // First time: every rank of the grid must see the same composition and sit where its layout
  // says. Two rounds (GTP, then TP) reach every rank of the grid, so all throw or none does.
  std::string reason;
  if (tp_on(first) && (tp.size() != grid.T || tp.rank() != grid.t)) {
    reason = fmt::format("TP group has rank {} of {}, the layouts say {} of {}", tp.rank(),
                         tp.size(), grid.t, grid.T);
  }
  if (grid.G > 1 && (gtp.size() != grid.G || gtp.rank() != grid.g)) {
    reason = fmt::format("GTP group has rank {} of {}, the layouts say {} of {}", gtp.rank(),
                         gtp.size(), grid.g, grid.G);
  }
  const std::uint64_t hash = fnv1a64(composition.data(), composition.size());
  bool ok = reason.empty();
  if (grid.G > 1) ok = all_agree(gtp, hash, ok);
  if (grid.T > 1) ok = all_agree(tp, hash, ok);
  if (!ok) {
    throw CollectiveError(fmt::format(
        "owner mode: the ranks of a {} x {} (TP x GTP) bucket of {} weights disagree on it{}{}",
        grid.T, grid.G, items.size(), reason.empty() ? "" : "; on this rank: ", reason));
  }
  std::vector<double> costs;
  costs.reserve(items.size());
  for (const OwnerItem& it : items)
    costs.push_back(cost_(*it.layout, it.algorithm));
  return cache_.emplace(std::move(key), lpt_assign(costs, grid.T * grid.G)).first->second;
}

void OwnerOrthogonalizer::run(std::span<const Weight> weights, const NsOptions& ns,
                              const ScaleFn& scale, Compute& compute, NsWorkspaces* workspaces) {
  last_owners_.assign(weights.size(), -1);
  // Buckets in the order of their first weight: the same order on every rank.
  struct Bucket {
    const Communicator* tp;
    const Communicator* gtp;
    std::vector<std::size_t> index;
  };
  std::vector<Bucket> buckets;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const Weight& w = weights[i];
    DISTMUON_ASSERT(w.layout != nullptr && w.tp != nullptr && w.gtp != nullptr, "owner weight");
    if (!sharded(*w.layout)) {
      NsOptions local = ns;
      local.algorithm = w.algorithm;
      orthogonalize_shard(w.shard, *w.layout, *w.tp, *w.gtp, TpMode::kDuplicated, local, scale,
                          compute, workspaces);
      continue;
    }
    const CommImpl* tp = tp_on(*w.layout) ? &w.tp->impl() : nullptr;
    const CommImpl* gtp = w.layout->gtp_size > 1 ? &w.gtp->impl() : nullptr;
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
      return (tp_on(*weights[b.index[0]].layout) ? &b.tp->impl() : nullptr) == tp &&
             (weights[b.index[0]].layout->gtp_size > 1 ? &b.gtp->impl() : nullptr) == gtp;
    });
    if (it == buckets.end()) it = buckets.insert(buckets.end(), Bucket{w.tp, w.gtp, {}});
    it->index.push_back(i);
  }
  std::vector<OwnerItem> items;
  for (const Bucket& b : buckets) {
    items.clear();
    for (const std::size_t i : b.index)
      items.push_back({weights[i].shard, weights[i].layout, weights[i].algorithm});
    const std::vector<int>& owners = owners_for(items, *b.tp, *b.gtp);
    for (std::size_t k = 0; k < b.index.size(); ++k)
      last_owners_[b.index[k]] = owners[k];
    orthogonalize_owned(items, owners, *b.tp, *b.gtp, ns, scale, compute, workspaces);
  }
}

}  // namespace distmuon::detail
