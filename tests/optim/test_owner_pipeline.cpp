// Owner mode's pipelined schedule (src/tp/owner_ns.h): a bucket's weights in chunks, every stage
// of a chunk (gather over GTP, over TP, the replicas' exchange, scatter over TP, over GTP) one
// non-blocking all-to-all in flight while another chunk's NS runs. For every grid of the world
// (TP x GTP with both stages, and at 4 ranks TP or GTP buckets whose homes span 2 replicas), the
// chunked schedule and the serial one (one chunk) give duplicated mode's bits, also over an
// emulated link whose exchanges are still in flight when the next stages start, and enter one
// all-to-all per stage per chunk on every rank, whatever the rank holds.
//
// Tolerance 0: the chunks only change when the exchanges run; every owner runs duplicated mode's
// NS on the same gathered bits. Any difference is a bug, not rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/layout.h"
#include "distmuon/tp.h"
#include "optim_test_util.h"
#include "tp/owner_ns.h"
#include "tp/sharded_ns.h"

namespace distmuon {
namespace {

using test::GridSize;
using test::TestLayout;

// Weights of different sizes (so that LPT's order is not the index order), split along both TP
// dimensions, with GTP padding rows where the rows do not split evenly.
std::vector<TestLayout> layouts_for(const GridSize& g) {
  const int T = g.T, G = g.G;
  std::vector<TestLayout> out = {
      {.m = 16 * T, .n = 40, .tp_dim = 0},   {.m = 24, .n = 12 * T, .tp_dim = 1},
      {.m = 48 * T, .n = 16, .tp_dim = 0},   {.m = 8 * G, .n = 8 * T, .tp_dim = 1},
      {.m = 32 * T, .n = 24, .tp_dim = 0},   {.m = 20, .n = 20 * T, .tp_dim = 1},
      {.m = 12 * T - 3, .n = 6, .tp_dim = 0}};
  for (TestLayout& l : out) {
    l.tp = T;
    l.gtp = G;
    if (T == 1) l.tp_dim = kNoPartition;
    if (T > 1 && l.tp_dim == 0 && l.m % T != 0) l.tp_pad = T - l.m % T;  // uneven TP
    l.pad = (G - l.m_tp() % G) % G;  // GTP padding rows up to a multiple of G
  }
  return out;
}

struct Counted {
  std::shared_ptr<CommStats> tp = std::make_shared<CommStats>();
  std::shared_ptr<CommStats> gtp = std::make_shared<CommStats>();
  std::shared_ptr<CommStats> dp = std::make_shared<CommStats>();
};

// OwnerOrthogonalizer on the grid's weights in `chunks` chunks (the link emulated when given), as
// the optimizer runs it: a first step on other values, then the step compared and counted, its
// buffers kept from the first (so a stage that read a buffer before its data arrived would see
// the first step's values); returns this rank's shards after it. chunks 0: duplicated mode on
// the same shards instead (each weight all-gathered and orthogonalised on every rank), the
// reference. choose: the orthogonalizer's OwnerChunksFn (then it decides the chunks).
std::vector<Matrix> run(const GridSize& g, int chunks, const LinkModel* link, Counted& counted,
                        detail::OwnerChunksFn choose = {}) {
  const auto [pg, replicas] = test::grid_groups(g);
  auto wrap = [&](const Communicator& c, const std::shared_ptr<CommStats>& stats) {
    const Communicator counting = counting_communicator(c, stats);
    return link != nullptr ? emulated_link_communicator(counting, *link) : counting;
  };
  const Communicator tp = wrap(pg.tp, counted.tp), gtp = wrap(pg.gtp, counted.gtp);
  const Communicator dp = wrap(replicas, counted.dp);
  const std::vector<TestLayout> ls = layouts_for(g);
  std::vector<ShardLayout> layouts;
  std::vector<Matrix> shards, first;
  for (std::size_t k = 0; k < ls.size(); ++k) {
    // The same values on every replica.
    const Matrix full = test::random_matrix(ls[k].m, ls[k].n, 50 + k);
    shards.push_back(test::shard_for(full.view(), ls[k], pg.tp.rank(), pg.gtp.rank()));
    const Matrix other = test::random_matrix(ls[k].m, ls[k].n, 90 + k);
    first.push_back(test::shard_for(other.view(), ls[k], pg.tp.rank(), pg.gtp.rank()));
    layouts.push_back(test::shard_layout(ls[k], pg, &dp));
  }
  NsOptions ns;
  detail::OwnerOrthogonalizer orth(detail::ns_flops_cost(ns), chunks, false, std::move(choose));
  detail::NsWorkspaces workspaces;
  const detail::ScaleFn scale = [](Index m, Index n) {
    return muon_scale(ScaleMode::kSpectral, m, n);
  };
  auto algorithm = [](std::size_t k) {
    return k % 2 == 0 ? NsAlgorithm::kStandard : NsAlgorithm::kGram;
  };
  if (chunks == 0) {
    for (std::size_t k = 0; k < ls.size(); ++k) {
      NsOptions one = ns;
      one.algorithm = algorithm(k);
      detail::orthogonalize_shard(shards[k].view(), layouts[k], pg.tp, pg.gtp, TpMode::kDuplicated,
                                  one, scale, cpu_compute());
    }
    return shards;
  }
  for (std::vector<Matrix>* step : {&first, &shards}) {
    std::vector<detail::OwnerOrthogonalizer::Weight> weights;
    for (std::size_t k = 0; k < ls.size(); ++k) {
      weights.push_back(
          {(*step)[k].view(), &layouts[k], &tp, &gtp, algorithm(k), g.D > 1 ? &dp : nullptr});
    }
    counted.tp->reset();
    counted.gtp->reset();
    counted.dp->reset();
    orth.run(weights, ns, scale, cpu_compute(), &workspaces);
  }
  return shards;
}

void check_grid(const GridSize& g) {
  SCOPED_TRACE("grid T " + std::to_string(g.T) + " x G " + std::to_string(g.G) + " x D " +
               std::to_string(g.D));
  Counted counted;
  const std::vector<Matrix> duplicated = run(g, 0, nullptr, counted);
  const std::size_t weights = duplicated.size();
  const LinkModel slow{2e-3, 1e9};  // 2 ms per exchange: every stage still in flight at the next
  for (const int chunks : {1, 2, 3, 100}) {
    for (const LinkModel* link : {static_cast<const LinkModel*>(nullptr), &slow}) {
      SCOPED_TRACE(std::to_string(chunks) + " chunks" + (link ? ", emulated link" : ""));
      const std::vector<Matrix> got = run(g, chunks, link, counted);
      test::expect_same_bits(got, duplicated, "owner mode", "weight",
                             "differs from duplicated mode");
      // One all-to-all per stage per chunk in each direction, on every rank (ranks that hold
      // nothing of a chunk enter its exchanges too): gather and scatter over TP and GTP, the
      // replicas' exchange once.
      const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(chunks), weights);
      EXPECT_EQ(counted.tp->all_to_all.calls, g.T > 1 ? 2 * n : 0u);
      EXPECT_EQ(counted.gtp->all_to_all.calls, g.G > 1 ? 2 * n : 0u);
      EXPECT_EQ(counted.dp->all_to_all.calls, g.D > 1 ? n : 0u);
    }
  }
}

TEST(OwnerPipeline, ChunksGiveTheSerialSchedulesBitsWithOneAllToAllPerStagePerChunk) {
  std::vector<GridSize> grids = test::world_grids();
  if (test::world().size() == 4) grids.push_back({1, 2, 2});  // GTP, the replicas' exchange, GTP
  for (const GridSize& g : grids)
    check_grid(g);
}

// A chooser's count (the optimizer's: the cost model's choice) is what runs, asked once per
// composition (both steps of run() share it) with the bucket's items and whether its homes span
// the replicas; the bits stay duplicated's.
TEST(OwnerPipeline, ChosenChunksRunOncePerComposition) {
  const int w = test::world().size();
  const GridSize g{1, w, 1};
  Counted counted;
  const std::vector<Matrix> duplicated = run(g, 0, nullptr, counted);
  int asked = 0;
  const std::vector<Matrix> got =
      run(g, 100, nullptr, counted, [&](std::span<const detail::OwnerItem> items, bool replicas) {
        ++asked;
        EXPECT_EQ(items.size(), duplicated.size());
        EXPECT_FALSE(replicas);
        return 3;
      });
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(counted.gtp->all_to_all.calls, 2u * 3u);  // gather and scatter per chunk
  test::expect_same_bits(got, duplicated, "3 chosen chunks", "weight",
                         "differs from duplicated mode");
}

// The chunks' order is cached with the owners: LPT's order of the costs (largest first, ties by
// index), the plan of every composition.
TEST(OwnerPipeline, PlanOrderIsLptsOrder) {
  const std::vector<double> costs = {2, 5, 5, 1, 3};
  const detail::OwnerPlan plan = detail::plan_owners(costs, 2);
  EXPECT_EQ(plan.order, (std::vector<std::size_t>{1, 2, 4, 0, 3}));
  EXPECT_EQ(plan.owners, lpt_assign(costs, 2));
}

// The chunks split the bucket's cost with the first and last chunks at half a share (their gather
// and scatter are exposed), every chunk at least one item.
TEST(OwnerPipeline, ChunkStartsGiveTheEndsHalfAShare) {
  // 13 equal items in 4 chunks: boundaries at 13 x {1/6, 1/2, 5/6} = 2.17, 6.5, 10.83 of the
  // items' midpoints 0.5, 1.5, ...: chunks of 2, 4, 5 and 2 items.
  const detail::OwnerPlan equal = detail::plan_owners(std::vector<double>(13, 1.0), 2);
  EXPECT_EQ(detail::chunk_starts(equal, 4), (std::vector<std::size_t>{0, 2, 6, 11, 13}));
  // One chunk: every item; more chunks than items: one chunk per item.
  EXPECT_EQ(detail::chunk_starts(equal, 1), (std::vector<std::size_t>{0, 13}));
  EXPECT_EQ(detail::chunk_starts(detail::plan_owners(std::vector<double>{1, 2}, 2), 5),
            (std::vector<std::size_t>{0, 1, 2}));
  // One item holds most of the cost: every chunk still gets one.
  const detail::OwnerPlan skewed = detail::plan_owners(std::vector<double>{1, 100, 1, 1}, 2);
  EXPECT_EQ(detail::chunk_starts(skewed, 3), (std::vector<std::size_t>{0, 1, 2, 4}));
}

}  // namespace
}  // namespace distmuon
