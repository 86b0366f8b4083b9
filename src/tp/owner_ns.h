#pragma once
// Owner mode (layer-sharded Muon): each sharded weight of a bucket is orthogonalised by ONE owner
// rank, which gathers the full matrix, runs the single-process Newton-Schulz on it (the same code
// as duplicated mode: orthogonalize_full), scales it and scatters the shards back. The NS work of
// a list of weights is split across the ranks that hold them instead of being repeated on each.
//
// A bucket is the weights that share the same (TP group, GTP group): the T x G ranks of the grid
// hold a shard of each. Rank (t, g) has owner index t + T g. Traffic per bucket, in two stages
// with only the TP and GTP communicators:
//   gather   1. all-to-all-v over GTP: every rank sends its shard of weight w to GTP rank g_o(w);
//               rank (t, g_o) then holds TP rank t's TP-local (padded) tensor of w.
//            2. all-to-all-v over TP: the ranks (t, g_o) send it to TP rank t_o(w), the owner.
//   scatter  the same two exchanges in reverse (TP, then GTP).
// One collective per stage per chunk of the bucket (stages over a group of one are skipped); a
// weight's full matrix crosses the network twice (in, out) instead of being all-gathered by every
// rank.
//
// Pipelined (orthogonalize_owned's chunks): the bucket's weights go in chunks, and every stage of
// a chunk is a non-blocking all-to-all (Communicator::start_all_to_all_v) in flight while another
// chunk's NS runs: the next chunks' gather stages (a chunk's TP stage starts once its GTP stage
// has arrived) and the earlier chunks' replica and scatter stages. The schedule is a function of
// the number of chunks and stages alone, the same on every rank. The chunks only copy: the same
// bits as the serial schedule (one chunk).
//
// Replicas (data parallelism): when a bucket's weights are replicated over a group of D ranks
// (ShardLayout::dp_size, the same shard on each) and the caller passes that group, the homes
// span the replicas: owner index o = t + T g + T G d, LPT over T G D homes. Every replica
// gathers the weights whose home sits at its position (t, g) (the gather stages above, within the
// replica), only the home runs NS, and one all-to-all-v over the replica group sends each home's
// results to the same position of the other replicas (D - 1 copies, as a broadcast would), before
// every replica scatters. Unsharded replicated weights (T = G = 1) move nothing but that: the
// home orthogonalises its own copy in place and the others receive the result into theirs. The
// home runs the NS every replica would have run on the same bits: bit-equal to every-rank NS.
//
// Owners are assigned by LPT (longest processing time first) on a per-weight cost estimate, ties
// broken by weight index then by owner index, so every rank computes the same assignment; it is
// decided, with the chunks' order and count, once per bucket composition and cached (OwnerPlan).

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/layout.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "tp/sharded_ns.h"

namespace distmuon::detail {

// Estimated cost (any unit, larger is slower) of orthogonalising one weight on its owner with an
// algorithm.
using OwnerCostFn = std::function<double(const ShardLayout&, NsAlgorithm)>;
// The default estimate: ns_flops of the full m x n matrix with ns's settings and the algorithm
// (the cost model's owner estimate assigns on the same FLOPs: estimate_owner_bucket).
OwnerCostFn ns_flops_cost(const NsOptions& ns);

// One weight of a bucket: this rank's update shard (shard_rows x n_tp, any ld) and its layout.
struct OwnerItem {
  MatrixView shard;
  const ShardLayout* layout = nullptr;
  NsAlgorithm algorithm = NsAlgorithm::kStandard;  // the owner's NS (ns's other settings)
};

// A bucket's plan: owners[i] (t + T g + T G d) runs NS for item i, and order holds the items in
// LPT's order (largest cost first, ties by index), the order the pipelined chunks take them in:
// LPT gives the first weights one to each owner, the next ones to the least loaded, so
// consecutive runs of that order keep the owners about as balanced in each chunk as over the
// bucket. costs: each item's cost estimate (OwnerCostFn). chunks: the chunks the bucket runs in
// (OwnerOrthogonalizer: its fixed count, or its OwnerChunksFn's choice for the composition).
struct OwnerPlan {
  std::vector<int> owners;
  std::vector<std::size_t> order;
  std::vector<double> costs;
  int chunks = 1;
};

// The chunks a bucket runs in, chosen once per bucket composition (the plan's chunks): its
// items, and whether its homes span the replicas (orthogonalize_owned's dp). A function of what
// every rank of the bucket agrees on (the composition, the options), never of rank-local timing:
// the count decides which collectives run. The optimizer's is the cost model's choice
// (src/optim/muon_chunks.cpp: the cheapest pipelined schedule, as tp_mode=auto prices it).
using OwnerChunksFn = std::function<int(std::span<const OwnerItem>, bool replicas)>;
// lpt_assign(costs, homes) and the order of its items.
OwnerPlan plan_owners(std::span<const double> costs, int homes);

// Where the chunks of a pipelined bucket start in plan.order: min(chunks, items) chunks, each of
// at least one item, with chunk j + 1 starting at the first item whose cost midpoint lies past
// (j + 1/2) / (chunks - 1) of the bucket's cost: the first and last chunks hold about half the
// share of the others, since the first one's gather and the last one's scatter have no NS to
// hide behind. Returns chunks + 1 indices: chunk j is order[starts[j], starts[j + 1]).
std::vector<std::size_t> chunk_starts(const OwnerPlan& plan, int chunks);

// Orthogonalises and scales a bucket in place as plan says. Every item shares tp (used when the
// layouts are TP-sharded) and gtp (when GTP-sharded), and every rank of the T x G grid calls this
// with the same items in the same order. No agreement check: see OwnerOrthogonalizer. The shards
// move over tp.data() and gtp.data(); the gathered buffers and the all-to-all staging come from
// workspaces when given (kept across steps).
// dp: the items' replica group when the homes span it (owners then range over T G D), else
// nullptr (each replica, if any, runs its own). chunks: the items go in up to this many chunks of
// consecutive items of plan.order (chunk_starts), each stage of a chunk (gather over GTP, over TP,
// the replicas' exchange, scatter over TP, over GTP: those whose group has more than one rank) one
// non-blocking all-to-all in flight while another chunk's NS runs (see the top of this file); 1 is
// the serial schedule (every stage after the one before). The same bits either way: the chunks only
// copy. bf16_wire: the results go to the other replicas in bf16 (half the bytes), the home rounding
// its own copy to bf16 as well, so that every replica holds the same bits (each element within
// bf16's rounding of the fp32 result).
// results: empty, or per item where its result is (nullptr: in its shard, as without results).
// An unsharded item that this rank receives from another replica's home (workspaces given) is
// then left where it arrived, in workspaces' receive staging, instead of copied into its shard
// (one pass over it fewer): *results[i] views it, valid until those staging buffers are next used
// (the next call with the same first_slot and chunk shapes); any other item's *results[i] is its
// shard. first_slot: the first of the workspaces' staging slots this call uses (1 + 5 chunks
// of them), so that the calls of one step (one per bucket) keep apart what they leave there.
void orthogonalize_owned(std::span<const OwnerItem> items, const OwnerPlan& plan,
                         const Communicator& tp, const Communicator& gtp, const Communicator* dp,
                         const NsOptions& ns, const ScaleFn& scale, Compute& compute,
                         NsWorkspaces* workspaces = nullptr, int chunks = 1, bool bf16_wire = false,
                         std::span<ConstMatrixView* const> results = {},
                         std::size_t first_slot = 0);

// Buckets a list of weights by group (TP, GTP, replicas), assigns owners (cached per bucket
// composition; the first time a composition is seen its ranks check, collectively, that they agree
// on it) and runs the buckets in the order of their first weight. Unsharded weights without
// replicas run the local NS.
class OwnerOrthogonalizer {
 public:
  // pipeline: orthogonalize_owned's chunks for every bucket (1: serial), unless choose is given:
  // then choose(items, replicas) decides each composition's count (its first run; a count below
  // 1 is 1). bf16_replicas: orthogonalize_owned's bf16_wire for replicated buckets.
  explicit OwnerOrthogonalizer(OwnerCostFn cost, int pipeline = kDefaultPipeline,
                               bool bf16_replicas = false, OwnerChunksFn choose = {})
      : cost_(std::move(cost)),
        chunks_(pipeline),
        bf16_replicas_(bf16_replicas),
        choose_(std::move(choose)) {}
  // The fixed count where nothing chooses (no profile to price the schedule with): most of the
  // exchanges hide behind the NS of the other chunks, at 3 more all-to-all latencies per stage.
  static constexpr int kDefaultPipeline = 4;

  struct Weight {
    MatrixView shard;
    const ShardLayout* layout = nullptr;
    const Communicator* tp = nullptr;   // this rank's TP group (any size when not TP-sharded)
    const Communicator* gtp = nullptr;  // this rank's GTP group
    NsAlgorithm algorithm = NsAlgorithm::kStandard;
    // The replicas of the weight (layout->dp_size ranks) when its home spans them; nullptr:
    // every replica orthogonalises its own copy.
    const Communicator* dp = nullptr;
    // Where the result is after run() (nullptr: in shard, not asked): orthogonalize_owned's
    // results, valid until the next run with the same workspaces.
    ConstMatrixView* result = nullptr;
  };
  // NS takes its scratch from workspaces when given (kept across steps), else allocates it.
  void run(std::span<const Weight> weights, const NsOptions& ns, const ScaleFn& scale,
           Compute& compute, NsWorkspaces* workspaces = nullptr);

  // Owner index (t + T g + T G d) of weights[i] in the last run; -1 for a weight run locally.
  const std::vector<int>& last_owners() const { return last_owners_; }
  // What run(weights) will do when every one of their buckets' compositions has its plan cached
  // (an earlier run had it: run() then takes that plan), else nothing. No collective.
  //   owners: the owner index each weight will get;
  //   send: per weight that this rank will orthogonalise and send to the other replicas
  //     (unsharded, replicated), its place in workspaces' send staging (allocated here): a
  //     weight passed to run() with its shard there needs no copy into the staging (the
  //     exchange's copy is then onto itself); empty for the others.
  struct CachedPlan {
    std::vector<int> owners;
    std::vector<MatrixView> send;
  };
  std::optional<CachedPlan> cached_plan(std::span<const Weight> weights, Compute& compute,
                                        NsWorkspaces& workspaces) const;

 private:
  struct Bucket {
    const Communicator* tp;
    const Communicator* gtp;
    const Communicator* dp;  // nullptr: the bucket's replicas (if any) each run their own NS
    std::vector<std::size_t> index;
  };
  // run()'s buckets of weights, in the order of their first weight (the same on every rank);
  // the weights that one rank holds whole, run locally, go to local.
  static std::vector<Bucket> buckets_of(std::span<const Weight> weights,
                                        std::vector<std::size_t>* local);
  const OwnerPlan& plan_for(std::span<const OwnerItem> items, const Communicator& tp,
                            const Communicator& gtp, const Communicator* dp);

  OwnerCostFn cost_;
  int chunks_ = 1;
  bool bf16_replicas_ = false;
  OwnerChunksFn choose_;
  using Key = std::tuple<std::weak_ptr<CommImpl>, std::weak_ptr<CommImpl>, std::weak_ptr<CommImpl>,
                         std::string>;
  // A bucket's cache key: its groups and its composition.
  static Key key_of(std::span<const OwnerItem> items, const Communicator& tp,
                    const Communicator& gtp, const Communicator* dp);
  struct KeyLess {
    bool operator()(const Key& a, const Key& b) const;
  };
  std::map<Key, OwnerPlan, KeyLess> cache_;
  std::vector<int> last_owners_;
};

}  // namespace distmuon::detail
