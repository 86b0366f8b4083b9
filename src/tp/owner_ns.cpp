#include "tp/owner_ns.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <memory>
#include <numeric>
#include <optional>

#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/hash.h"

namespace distmuon::detail {
namespace {

std::size_t elems(Index rows, Index cols) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
}

// One all-to-all of a stage over a group of P ranks: per peer j, the blocks this rank sends it
// and the blocks it receives from it, each list in bucket order. The counts follow from the
// blocks' shapes; a scatter stage is the reverse of its gather stage.
struct Exchange {
  explicit Exchange(std::size_t peers) : to(peers), from(peers) {}
  std::vector<std::vector<MatrixView>> to, from;
  Exchange reversed() const {
    Exchange r(to.size());
    r.to = from;
    r.from = to;
    return r;
  }
};

// An exchange in flight: its request and where what arrives goes (on a bf16 wire it arrives
// packed in recv16, n_recv values, and is unpacked into recv first). kept: per block of from
// (empty: none), where to point at the block's place in recv instead of copying it out.
struct Started {
  std::unique_ptr<CommRequest> request;
  float* recv = nullptr;
  std::vector<std::vector<MatrixView>> from;
  const float* recv16 = nullptr;
  std::size_t n_recv = 0;
  std::vector<std::vector<ConstMatrixView*>> kept;
};

// The stages of a chunk (orthogonalize_owned): each exchange in flight has its own staging slot.
enum class Stage { kGatherGtp, kGatherTp, kReplicas, kScatterTp, kScatterGtp };
constexpr std::size_t kStages = 5;
// The staging slot of chunk c's stage s in a call whose slots start at first_slot.
std::size_t staging_slot(std::size_t first_slot, std::size_t c, Stage s) {
  return first_slot + 1 + c * kStages + static_cast<std::size_t>(s);
}
// The slots a call of orthogonalize_owned with `chunks` chunks uses.
std::size_t staging_slots(int chunks) {
  return 1 + static_cast<std::size_t>(std::max(chunks, 1)) * kStages;
}

MatrixView column(float* data, std::size_t n) {
  return {data, static_cast<Index>(n), 1, 1};
}

// Packs every block sent into one staging buffer (peer by peer, one compute.copy per block) and
// starts the all-to-all over the group's data plane (finish unpacks what arrives into the blocks
// received). The staging buffers come from workspaces (slot: one per exchange in flight), kept
// across steps. bf16: the staging is packed into bf16 (Compute::pack_bf16) and sent so, half the
// bytes.
Started start_exchange(const Communicator& group, const Exchange& x, Compute& compute,
                       NsWorkspaces& workspaces, std::size_t slot, bool bf16 = false) {
  const std::size_t peers = x.to.size();
  DISTMUON_ASSERT(peers == static_cast<std::size_t>(group.size()), "one list per peer");
  std::vector<std::size_t> send_counts(peers, 0), recv_counts(peers, 0);
  for (std::size_t j = 0; j < peers; ++j) {
    for (const MatrixView& v : x.to[j])
      send_counts[j] += elems(v.rows, v.cols);
    for (const MatrixView& v : x.from[j])
      recv_counts[j] += elems(v.rows, v.cols);
  }
  const std::size_t n_send =
      std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
  const std::size_t n_recv =
      std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
  float* const send =
      workspaces.buffer(compute, BufferRole::kSend, slot, static_cast<Index>(n_send), 1)
          .view()
          .data;
  float* const recv =
      workspaces.buffer(compute, BufferRole::kRecv, slot, static_cast<Index>(n_recv), 1)
          .view()
          .data;
  std::size_t at = 0;
  for (const auto& blocks : x.to) {
    for (const MatrixView& v : blocks) {
      compute.copy(v, MatrixView{send + at, v.rows, v.cols, v.cols});
      at += elems(v.rows, v.cols);
    }
  }
  if (!bf16) {
    return {group.data().start_all_to_all_v<float>({send, n_send}, send_counts, {recv, n_recv},
                                                   recv_counts),
            recv,
            x.from,
            nullptr,
            0,
            {}};
  }
  auto packed = [&](BufferRole role, std::size_t n) {
    return workspaces.buffer(compute, role, slot, static_cast<Index>((n + 1) / 2), 1).view().data;
  };
  float* const send16 = packed(BufferRole::kSendBf16, n_send);
  float* const recv16 = packed(BufferRole::kRecvBf16, n_recv);
  if (n_send > 0) compute.pack_bf16(column(send, n_send), send16);
  return {group.data().start_all_to_all_v<Bf16Bits>(
              {reinterpret_cast<const Bf16Bits*>(send16), n_send}, send_counts,
              {reinterpret_cast<Bf16Bits*>(recv16), n_recv}, recv_counts),
          recv,
          x.from,
          recv16,
          n_recv,
          {}};
}

void finish(Started& x, Compute& compute) {
  x.request->wait();
  if (x.recv16 != nullptr && x.n_recv > 0) compute.unpack_bf16(x.recv16, column(x.recv, x.n_recv));
  std::size_t at = 0;
  for (std::size_t j = 0; j < x.from.size(); ++j) {
    for (std::size_t k = 0; k < x.from[j].size(); ++k) {
      const MatrixView& v = x.from[j][k];
      const ConstMatrixView arrived{x.recv + at, v.rows, v.cols, v.cols};
      if (!x.kept.empty() && x.kept[j][k] != nullptr) {
        *x.kept[j][k] = arrived;
      } else {
        compute.copy(arrived, v);
      }
      at += elems(v.rows, v.cols);
    }
  }
}

// The bucket's grid: T x G ranks, this rank at (t, g), repeated over D replicas (this one d).
// An owner index is a home: position t + T g within replica d_of(home).
struct Grid {
  int T = 1, G = 1, D = 1, t = 0, g = 0, d = 0;
  int t_of(int owner) const { return owner % T; }
  int g_of(int owner) const { return owner / T % G; }
  int d_of(int owner) const { return owner / (T * G); }
  int position_of(int owner) const { return owner % (T * G); }
  int me() const { return t + T * g; }           // this rank's position in its replica
  int home() const { return me() + T * G * d; }  // this rank's owner index
  int homes() const { return T * G * D; }
};

Grid grid_of(const ShardLayout& l, bool replicated) {
  const bool dp = replicated && l.dp_on();
  return {l.tp_on() ? l.tp_size : 1, l.gtp_size, dp ? l.dp_size : 1,
          l.tp_on() ? l.tp_rank : 0, l.gtp_rank, dp ? l.dp_rank : 0};
}

// The TP block of rank j in a full work matrix.
MatrixView tp_block(MatrixView full, const ShardLayout& l, int j) {
  const Index r_tp = l.padded_rows(), n_tp = l.n_tp();
  return l.tp_dim == 0 ? full.block(j * r_tp, 0, r_tp, n_tp) : full.block(0, j * n_tp, r_tp, n_tp);
}

// A one-line description of a layout (rank fields excluded): the composition key of a bucket.
std::string describe(const ShardLayout& l) {
  return fmt::format("{}x{}:tp{}/{}+{}:gtp{}:pad{}:qkv{}:dp{}", l.m, l.n, l.tp_dim,
                     l.tp_on() ? l.tp_size : 1, l.tp_pad, l.gtp_size, l.pad, fmt::join(l.qkv, ","),
                     l.dp_size);
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

OwnerPlan plan_owners(std::span<const double> costs, int homes) {
  OwnerPlan plan{lpt_assign(costs, homes), std::vector<std::size_t>(costs.size()),
                 std::vector<double>(costs.begin(), costs.end())};
  std::iota(plan.order.begin(), plan.order.end(), std::size_t{0});
  std::stable_sort(plan.order.begin(), plan.order.end(),
                   [&](std::size_t x, std::size_t y) { return costs[x] > costs[y]; });
  return plan;
}

std::vector<std::size_t> chunk_starts(const OwnerPlan& plan, int chunks) {
  const std::size_t n = plan.order.size();
  if (n == 0) return {0};
  const std::size_t n_chunks = std::clamp<std::size_t>(static_cast<std::size_t>(chunks), 1, n);
  // The midpoint of each item's cost on the bucket's cumulative cost, in plan.order.
  std::vector<double> mid(n);
  double total = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const double c = plan.costs[plan.order[k]];
    mid[k] = total + c / 2;
    total += c;
  }
  std::vector<std::size_t> starts(n_chunks + 1, 0);
  starts[n_chunks] = n;
  for (std::size_t j = 1; j < n_chunks; ++j) {
    const double bound = total * (static_cast<double>(j) - 0.5) / static_cast<double>(n_chunks - 1);
    const auto past =
        static_cast<std::size_t>(std::lower_bound(mid.begin(), mid.end(), bound) - mid.begin());
    starts[j] = std::clamp(past, starts[j - 1] + 1, n - (n_chunks - j));
  }
  return starts;
}

void orthogonalize_owned(std::span<const OwnerItem> items, const OwnerPlan& plan,
                         const Communicator& tp, const Communicator& gtp, const Communicator* dp,
                         const NsOptions& ns, const ScaleFn& scale, Compute& compute,
                         NsWorkspaces* workspaces, int chunks, bool bf16_wire,
                         std::span<ConstMatrixView* const> results, std::size_t first_slot) {
  const std::vector<int>& owners = plan.owners;
  DISTMUON_ASSERT(items.size() == owners.size() && items.size() == plan.order.size() &&
                      items.size() == plan.costs.size(),
                  "one owner and one cost per item, every item in the order once");
  DISTMUON_ASSERT(results.empty() || results.size() == items.size(), "one result per item");
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i] != nullptr) *results[i] = items[i].shard;
  }
  if (items.empty()) return;
  NsWorkspaces call_workspaces;  // only when the caller keeps none
  NsWorkspaces& ws = workspaces != nullptr ? *workspaces : call_workspaces;
  const Grid grid = grid_of(*items.front().layout, dp != nullptr);
  DISTMUON_ASSERT(grid.T == 1 || tp.size() == grid.T, "TP group size");
  DISTMUON_ASSERT(grid.G == 1 || gtp.size() == grid.G, "GTP group size");
  DISTMUON_ASSERT(grid.D == 1 || dp->size() == grid.D, "replica group size");
  const std::size_t n_items = items.size();
  auto layout = [&](std::size_t i) -> const ShardLayout& { return *items[i].layout; };
  const auto G = static_cast<std::size_t>(grid.G), T = static_cast<std::size_t>(grid.T);
  const auto D = static_cast<std::size_t>(grid.D);
  // holds: this rank's position gathers the full matrix (in every replica); runs: this rank is
  // the home that orthogonalises it.
  auto holds = [&](std::size_t i) { return grid.position_of(owners[i]) == grid.me(); };
  auto runs = [&](std::size_t i) { return owners[i] == grid.home(); };
  auto in_row = [&](std::size_t i) { return grid.g_of(owners[i]) == grid.g; };
  const bool unsharded = grid.T == 1 && grid.G == 1;

  // The TP-local tensors this rank gathers (the weights whose owner sits in its GTP row,
  // g_o == g; without GTP every weight, its shard being the TP-local tensor), and the owner's
  // full work matrices (without TP the TP-local tensor is the full one; unsharded, the shard
  // itself). Both kept across steps in ws, per weight of the bucket (slot i).
  std::vector<MatrixView> tp_local(n_items), full(n_items);
  for (std::size_t i = 0; i < n_items; ++i) {
    if (unsharded) {
      tp_local[i] = items[i].shard;
      continue;
    }
    if (grid.G == 1 || in_row(i)) {
      tp_local[i] =
          ws.buffer(compute, BufferRole::kTpLocal, i, layout(i).padded_rows(), layout(i).n_tp())
              .view();
    }
    if (grid.T > 1 && holds(i)) {
      full[i] = ws.buffer(compute, BufferRole::kFull, i, full_work_rows(layout(i)),
                          full_work_cols(layout(i)))
                    .view();
    }
  }
  auto work = [&](std::size_t i) { return grid.T > 1 ? full[i] : tp_local[i]; };

  // The items in chunks of consecutive items of the plan's order (chunk_starts).
  const std::vector<std::size_t> starts = chunk_starts(plan, chunks);
  const std::size_t n_chunks = starts.size() - 1;
  std::vector<std::vector<std::size_t>> chunk(n_chunks);
  for (std::size_t j = 0; j < n_chunks; ++j)
    chunk[j].assign(plan.order.begin() + static_cast<std::ptrdiff_t>(starts[j]),
                    plan.order.begin() + static_cast<std::ptrdiff_t>(starts[j + 1]));

  // Stage 1 (GTP): GTP rank j sends the owner's row (g_o) its row block of the TP-local tensor.
  auto gtp_stage = [&](const std::vector<std::size_t>& ids) {
    Exchange x(G);
    for (std::size_t j = 0; j < G; ++j) {
      for (const std::size_t i : ids) {
        if (static_cast<std::size_t>(grid.g_of(owners[i])) == j) x.to[j].push_back(items[i].shard);
        if (in_row(i)) {
          const Index r_l = layout(i).shard_rows();
          x.from[j].push_back(tp_local[i].row_block(static_cast<Index>(j) * r_l, r_l));
        }
      }
    }
    return x;
  };
  // Stage 2 (TP): TP rank j sends the owner (t_o) its TP-local tensor, a TP block of the full one.
  auto tp_stage = [&](const std::vector<std::size_t>& ids) {
    Exchange x(T);
    for (std::size_t j = 0; j < T; ++j) {
      for (const std::size_t i : ids) {
        if (in_row(i) && static_cast<std::size_t>(grid.t_of(owners[i])) == j)
          x.to[j].push_back(tp_local[i]);
        if (holds(i)) x.from[j].push_back(tp_block(full[i], layout(i), static_cast<int>(j)));
      }
    }
    return x;
  };
  // Replicas: the home sends its result to the same position of every other replica.
  // Unsharded, with results asked for: what arrives stays in the receive staging (kept).
  const bool keep_received = unsharded && !results.empty() && workspaces != nullptr;
  std::vector<std::vector<ConstMatrixView*>> kept;
  auto dp_stage = [&](const std::vector<std::size_t>& ids) {
    if (keep_received) kept.assign(D, {});
    Exchange x(D);
    for (std::size_t j = 0; j < D; ++j) {
      if (j == static_cast<std::size_t>(grid.d)) continue;
      for (const std::size_t i : ids) {
        if (runs(i)) x.to[j].push_back(work(i));
        if (holds(i) && static_cast<std::size_t>(grid.d_of(owners[i])) == j) {
          x.from[j].push_back(work(i));
          if (keep_received) kept[j].push_back(results[i]);
        }
      }
    }
    return x;
  };
  // Without GTP the TP-local tensor is the shard itself, copied in and out of its buffer.
  const bool copies = grid.G == 1 && !unsharded;

  // A chunk's stages in the order they run: the gather's (GTP, then TP), its NS, then the
  // replicas' exchange and the scatter's (the gather's reversed: TP, then GTP). Each stage but NS
  // is one all-to-all over its group, present when the group has more than one rank: the same
  // stages on every rank of the grid.
  std::vector<Stage> pre, post;
  if (grid.G > 1) pre.push_back(Stage::kGatherGtp);
  if (grid.T > 1) pre.push_back(Stage::kGatherTp);
  if (grid.D > 1) post.push_back(Stage::kReplicas);
  if (grid.T > 1) post.push_back(Stage::kScatterTp);
  if (grid.G > 1) post.push_back(Stage::kScatterGtp);
  // Starts chunk c's stage s (its own staging slot: every exchange in flight has its own).
  auto start = [&](Stage s, std::size_t c) {
    const std::vector<std::size_t>& ids = chunk[c];
    const std::size_t slot = staging_slot(first_slot, c, s);
    switch (s) {
      case Stage::kGatherGtp:
        return start_exchange(gtp, gtp_stage(ids), compute, ws, slot);
      case Stage::kGatherTp:
        if (copies) {
          for (const std::size_t i : ids)
            compute.copy(items[i].shard, tp_local[i]);
        }
        return start_exchange(tp, tp_stage(ids), compute, ws, slot);
      case Stage::kReplicas: {
        const Exchange x = dp_stage(ids);
        Started started = start_exchange(*dp, x, compute, ws, slot, bf16_wire);
        started.kept = std::move(kept);
        return started;
      }
      case Stage::kScatterTp:
        return start_exchange(tp, tp_stage(ids).reversed(), compute, ws, slot);
      case Stage::kScatterGtp:
        return start_exchange(gtp, gtp_stage(ids).reversed(), compute, ws, slot);
    }
    DISTMUON_ASSERT(false, "owner stage");
    return Started{};
  };

  // The home's NS: the code duplicated mode runs on the same matrix; a chunk's weights this rank
  // runs, those of equal shape as one batch (orthogonalize_fulls).
  std::vector<FullWork> homed;
  auto orthogonalize = [&](std::size_t c) {
    homed.clear();
    for (const std::size_t i : chunk[c]) {
      if (runs(i)) homed.push_back({work(i), &layout(i), items[i].algorithm});
    }
    orthogonalize_fulls(homed, ns, scale, compute, ws);
    // A bf16 wire: the home keeps what the other replicas receive.
    for (const FullWork& h : homed) {
      if (bf16_wire && grid.D > 1) compute.round(h.full, Precision::kBf16);
    }
  };

  // The schedule, in ticks, the same on every rank (which collective is entered next never
  // depends on this rank's data): tick t runs chunk t's NS; chunk c's gather stage j (of a) is
  // started at tick c - a + j, before that tick's NS, its scatter-side stage j (of b) at tick
  // c + j, after it, and each is waited for at the next tick, before its chunk's next stage (or
  // NS) starts. So while chunk t's NS runs, the next chunks' gather stages and the earlier
  // chunks' replica and scatter stages are in flight, at most one gather and one scatter per
  // group; a chunk's second stage starts once its first has arrived. One chunk is the serial
  // schedule: every stage after the one before.
  const auto a = static_cast<std::ptrdiff_t>(pre.size());
  const auto b = static_cast<std::ptrdiff_t>(post.size());
  const auto n = static_cast<std::ptrdiff_t>(n_chunks);
  std::vector<std::optional<Started>> in_flight(n_chunks);  // each chunk's current exchange
  auto wait = [&](std::ptrdiff_t c) {
    const auto k = static_cast<std::size_t>(c);
    if (!in_flight[k]) return;
    finish(*in_flight[k], compute);
    in_flight[k].reset();
  };
  auto begin = [&](Stage s, std::ptrdiff_t c) {
    in_flight[static_cast<std::size_t>(c)] = start(s, static_cast<std::size_t>(c));
  };
  for (std::ptrdiff_t t = -a; t < n + b; ++t) {
    // Before the NS: chunk t's last gather stage arrives; chunk c > t starts gather stage
    // t + a - c once its previous one has arrived.
    for (std::ptrdiff_t c = std::max<std::ptrdiff_t>(t, 0); c <= std::min(t + a, n - 1); ++c) {
      wait(c);
      if (c > t) begin(pre[static_cast<std::size_t>(t + a - c)], c);
    }
    if (t >= 0 && t < n) orthogonalize(static_cast<std::size_t>(t));
    // After it: chunk c <= t starts its stage t - c once its previous one has arrived; chunk
    // t - b's last stage arrives (and, without GTP, its shards are copied out).
    for (std::ptrdiff_t c = std::max<std::ptrdiff_t>(t - b, 0); c <= std::min(t, n - 1); ++c) {
      wait(c);
      if (c > t - b) {
        begin(post[static_cast<std::size_t>(t - c)], c);
      } else if (copies) {
        for (const std::size_t i : chunk[static_cast<std::size_t>(c)])
          compute.copy(tp_local[i], items[i].shard);
      }
    }
  }
}

bool OwnerOrthogonalizer::KeyLess::operator()(const Key& a, const Key& b) const {
  const auto& [a_tp, a_gtp, a_dp, a_s] = a;
  const auto& [b_tp, b_gtp, b_dp, b_s] = b;
  if (a_tp.owner_before(b_tp)) return true;
  if (b_tp.owner_before(a_tp)) return false;
  if (a_gtp.owner_before(b_gtp)) return true;
  if (b_gtp.owner_before(a_gtp)) return false;
  if (a_dp.owner_before(b_dp)) return true;
  if (b_dp.owner_before(a_dp)) return false;
  return a_s < b_s;
}

OwnerOrthogonalizer::Key OwnerOrthogonalizer::key_of(std::span<const OwnerItem> items,
                                                     const Communicator& tp,
                                                     const Communicator& gtp,
                                                     const Communicator* dp) {
  const ShardLayout& first = *items.front().layout;
  const Grid grid = grid_of(first, dp != nullptr);
  std::string composition = fmt::format("grid {}x{}x{}", grid.T, grid.G, grid.D);
  for (const OwnerItem& it : items)
    composition += fmt::format(";{}:{}", describe(*it.layout), to_string(it.algorithm));
  return {first.tp_on() ? tp.impl_ptr() : nullptr, first.gtp_size > 1 ? gtp.impl_ptr() : nullptr,
          grid.D > 1 ? dp->impl_ptr() : nullptr, composition};
}

const OwnerPlan& OwnerOrthogonalizer::plan_for(std::span<const OwnerItem> items,
                                               const Communicator& tp, const Communicator& gtp,
                                               const Communicator* dp) {
  const ShardLayout& first = *items.front().layout;
  const Grid grid = grid_of(first, dp != nullptr);
  Key key = key_of(items, tp, gtp, dp);
  const auto cached = cache_.find(key);
  // The chunks: the cached plan's, else this composition's count (choose_, once; no collective).
  std::string reason;
  int chunks = chunks_;
  if (cached != cache_.end()) {
    chunks = cached->second.chunks;
  } else if (choose_) {
    try {
      chunks = choose_(items, dp != nullptr);
    } catch (const Error& e) {
      reason = fmt::format("choosing its chunks: {}", e.what());
    }
  }
  chunks = std::max(chunks, 1);
  // Every call: every rank of the grid must see the same composition and chunk count and sit
  // where its layout says (agree_on_tp_grid: all throw or none does). Only the plan is cached:
  // skipping the check on a rank that saw its composition before would leave a rank holding a
  // different, new composition waiting in it.
  const std::string composition = fmt::format("{};chunks {}", std::get<3>(key), chunks);
  if (first.tp_on() && (tp.size() != grid.T || tp.rank() != grid.t)) {
    reason = fmt::format("TP group has rank {} of {}, the layouts say {} of {}", tp.rank(),
                         tp.size(), grid.t, grid.T);
  }
  if (grid.G > 1 && (gtp.size() != grid.G || gtp.rank() != grid.g)) {
    reason = fmt::format("GTP group has rank {} of {}, the layouts say {} of {}", gtp.rank(),
                         gtp.size(), grid.g, grid.G);
  }
  if (grid.D > 1 && (dp->size() != grid.D || dp->rank() != grid.d)) {
    reason = fmt::format("data-parallel group has rank {} of {}, the layouts say replica {} of {}",
                         dp->rank(), dp->size(), grid.d, grid.D);
  }
  const Communicator one = local_communicator();  // a dimension the layouts do not split
  agree_on_tp_grid(
      grid.T > 1 ? tp : one, grid.G > 1 ? gtp : one, grid.D > 1 ? *dp : one,
      fnv1a64(composition.data(), composition.size()), reason.empty(),
      fmt::format("owner mode: the composition of a bucket of {} weights", items.size()), reason);
  if (cached != cache_.end()) return cached->second;
  std::vector<double> costs;
  costs.reserve(items.size());
  for (const OwnerItem& it : items)
    costs.push_back(cost_(*it.layout, it.algorithm));
  OwnerPlan plan = plan_owners(costs, grid.homes());
  plan.chunks = chunks;
  return cache_.emplace(std::move(key), std::move(plan)).first->second;
}

std::vector<OwnerOrthogonalizer::Bucket> OwnerOrthogonalizer::buckets_of(
    std::span<const Weight> weights, std::vector<std::size_t>* local) {
  // The groups a weight's bucket is told apart by (nullptr for a dimension it does not span).
  auto groups_of = [](const Weight& w) {
    return std::array<const CommImpl*, 3>{
        w.layout->tp_on() ? &w.tp->impl() : nullptr,
        w.layout->gtp_size > 1 ? &w.gtp->impl() : nullptr,
        w.dp != nullptr && w.layout->dp_on() ? &w.dp->impl() : nullptr};
  };
  std::vector<Bucket> buckets;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const Weight& w = weights[i];
    DISTMUON_ASSERT(w.layout != nullptr && w.tp != nullptr && w.gtp != nullptr, "owner weight");
    const auto groups = groups_of(w);
    if (groups == std::array<const CommImpl*, 3>{}) {  // one rank holds it all: the local NS
      if (local != nullptr) local->push_back(i);
      continue;
    }
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
      return groups_of(weights[b.index[0]]) == groups;
    });
    if (it == buckets.end()) {
      it = buckets.insert(buckets.end(), Bucket{w.tp, w.gtp, groups[2] ? w.dp : nullptr, {}});
    }
    it->index.push_back(i);
  }
  return buckets;
}

std::optional<OwnerOrthogonalizer::CachedPlan> OwnerOrthogonalizer::cached_plan(
    std::span<const Weight> weights, Compute& compute, NsWorkspaces& workspaces) const {
  CachedPlan out{std::vector<int>(weights.size(), -1), std::vector<MatrixView>(weights.size())};
  std::vector<OwnerItem> items;
  std::size_t first_slot = 0;  // as run() gives them
  for (const Bucket& b : buckets_of(weights, nullptr)) {
    items.clear();
    for (const std::size_t i : b.index)
      items.push_back({weights[i].shard, weights[i].layout, weights[i].algorithm});
    const auto it = cache_.find(key_of(items, *b.tp, *b.gtp, b.dp));
    if (it == cache_.end()) return std::nullopt;
    const OwnerPlan& plan = it->second;
    for (std::size_t k = 0; k < b.index.size(); ++k)
      out.owners[b.index[k]] = plan.owners[k];
    // Unsharded and replicated: the replicas' exchange sends this rank's homes' results from its
    // staging, per chunk to each other replica in turn (orthogonalize_owned's dp_stage); each
    // result's place in the first other replica's part.
    const Grid grid = grid_of(*items.front().layout, b.dp != nullptr);
    if (grid.T == 1 && grid.G == 1 && grid.D > 1) {
      const std::vector<std::size_t> starts = chunk_starts(plan, plan.chunks);
      for (std::size_t c = 0; c + 1 < starts.size(); ++c) {
        std::vector<std::size_t> homed;  // the chunk's items homed here, in the chunk's order
        std::size_t n = 0;
        for (std::size_t q = starts[c]; q < starts[c + 1]; ++q) {
          const std::size_t k = plan.order[q];
          if (plan.owners[k] != grid.home()) continue;
          homed.push_back(k);
          n += elems(items[k].shard.rows, items[k].shard.cols);
        }
        if (homed.empty()) continue;
        float* send =
            workspaces
                .buffer(compute, BufferRole::kSend, staging_slot(first_slot, c, Stage::kReplicas),
                        static_cast<Index>(n * (grid.D - 1)), 1)
                .view()
                .data;
        for (const std::size_t k : homed) {
          const MatrixView& v = items[k].shard;
          out.send[b.index[k]] = {send, v.rows, v.cols, v.cols};
          send += elems(v.rows, v.cols);
        }
      }
    }
    first_slot += staging_slots(plan.chunks);
  }
  return out;
}

void OwnerOrthogonalizer::run(std::span<const Weight> weights, const NsOptions& ns,
                              const ScaleFn& scale, Compute& compute, NsWorkspaces* workspaces) {
  last_owners_.assign(weights.size(), -1);
  // Buckets in the order of their first weight: the same order on every rank.
  std::vector<std::size_t> local;
  const std::vector<Bucket> buckets = buckets_of(weights, &local);
  for (const std::size_t i : local) {  // one rank holds it all: the local NS
    const Weight& w = weights[i];
    NsOptions o = ns;
    o.algorithm = w.algorithm;
    orthogonalize_shard(w.shard, *w.layout, *w.tp, *w.gtp, TpMode::kDuplicated, o, scale, compute,
                        workspaces);
    if (w.result != nullptr) *w.result = w.shard;
  }
  std::vector<OwnerItem> items;
  std::vector<ConstMatrixView*> results;
  std::size_t first_slot = 0;  // each bucket its own staging slots: results kept stay valid
  for (const Bucket& b : buckets) {
    items.clear();
    results.clear();
    for (const std::size_t i : b.index) {
      items.push_back({weights[i].shard, weights[i].layout, weights[i].algorithm});
      results.push_back(weights[i].result);
    }
    const OwnerPlan& plan = plan_for(items, *b.tp, *b.gtp, b.dp);
    for (std::size_t k = 0; k < b.index.size(); ++k)
      last_owners_[b.index[k]] = plan.owners[k];
    orthogonalize_owned(items, plan, *b.tp, *b.gtp, b.dp, ns, scale, compute, workspaces,
                        plan.chunks, bf16_replicas_, results, first_slot);
    first_slot += staging_slots(plan.chunks);
  }
}

}  // namespace distmuon::detail

namespace distmuon {

std::vector<int> lpt_assign(std::span<const double> costs, int ranks) {
  if (ranks < 1) throw Error(fmt::format("lpt_assign: {} ranks (must be >= 1)", ranks));
  std::vector<std::size_t> order(costs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
  std::vector<int> owner(costs.size(), 0);
  for (const std::size_t i : order) {
    // min_element returns the first (lowest) bin among equal loads.
    const auto bin = std::min_element(load.begin(), load.end()) - load.begin();
    owner[i] = static_cast<int>(bin);
    load[static_cast<std::size_t>(bin)] += costs[i];
  }
  return owner;
}

}  // namespace distmuon
