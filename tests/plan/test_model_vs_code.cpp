// The refined model counts what the dispatcher (orthogonalize_shard, layout.h) really does: its
// collectives and payload bytes (the counting communicator) and its FLOPs (a counting compute
// backend), for both modes, both partition dims, GTP padding and the two-step TP x GTP case, with
// the key built from the layout by auto_key as the optimizer builds it. Exact equality: all counts
// are integers well inside double's range.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "counting_compute.h"
#include "distmuon/cost_model.h"
#include "distmuon/layout.h"
#include "distmuon/tp.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::CountingCompute;

void expect_counts_match(const CommStats& stats, double flops, const ModeCost& c) {
  EXPECT_EQ(stats.all_gather.calls, static_cast<std::size_t>(c.all_gathers));
  EXPECT_EQ(stats.all_reduce.calls, static_cast<std::size_t>(c.all_reduces));
  EXPECT_EQ(static_cast<double>(stats.all_gather.bytes + stats.all_reduce.bytes), c.payload_bytes);
  EXPECT_EQ(flops, c.flops);
}

TEST(RefinedModelVsCode, CollectivesBytesAndFlopsMatchTheCode) {
  const Communicator& world = test::world();
  const int g = world.size();
  if (g == 1) GTEST_SKIP() << "a group of one runs the local NS without collectives";
  NsOptions opts;  // quintic: c != 0 on every step, as the model assumes
  opts.steps = 4;  // the fewest steps the schedule check accepts for quintic
  const Matrix full = test::random_matrix(48, 32, 11);
  for (const bool syrk : {true, false}) {
    opts.use_syrk = syrk;
    for (const int dim : {0, 1}) {
      for (const TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed}) {
        SCOPED_TRACE(testing::Message()
                     << "dim " << dim << " " << to_string(mode) << " syrk " << syrk);
        auto stats = std::make_shared<CommStats>();
        const Communicator group = counting_communicator(world, stats);
        Matrix shard = shard_of(full.view(), dim, g, world.rank());
        newton_schulz_tp(shard.view(), dim, group, mode, opts, cpu_compute());  // warm-up
        stats->reset();
        shard = shard_of(full.view(), dim, g, world.rank());
        CountingCompute compute;
        newton_schulz_tp(shard.view(), dim, group, mode, opts, compute);
        // newton_schulz_tp checks the shard shapes on every call (one all-reduce of three int64)
        // and agrees on its result's check (one all-gather of an int32 per rank), which the
        // optimizer's path, and so the model, does not have.
        CommStats measured = *stats;
        ASSERT_GE(measured.all_reduce.calls, 1u);
        ASSERT_GE(measured.all_gather.calls, 1u);
        measured.all_reduce.calls -= 1;
        measured.all_reduce.bytes -= 3 * 8;
        measured.all_gather.calls -= 1;
        measured.all_gather.bytes -= 4 * static_cast<std::size_t>(g);

        const ShardLayout layout = group_layout(shard.rows(), shard.cols(), dim, g, world.rank());
        const AutoKey key = auto_key(layout, opts, NsAlgorithm::kStandard, false);
        EXPECT_EQ(key.group_size, g);
        EXPECT_EQ(key.partition_dim, dim);
        const CostEstimate est = estimate_refined(key, nullptr);
        expect_counts_match(measured, compute.flops,
                            mode == TpMode::kDuplicated ? est.duplicated : est.distributed);
      }
    }
  }
}

// This rank's shard of `full` under layout: its TP shard, padded with zero rows, its GTP rows.
Matrix local_shard(const Matrix& full, const ShardLayout& l) {
  const Matrix tp_local =
      l.tp_on() ? shard_of(full.view(), l.tp_dim, l.tp_size, l.tp_rank) : Matrix::from(full.view());
  Matrix padded(l.padded_rows(), l.n_tp());
  copy(tp_local.view(), padded.view().block(0, 0, l.m_tp(), l.n_tp()));
  return l.gtp_on() ? shard_of(padded.view(), 0, l.gtp_size, l.gtp_rank) : padded;
}

struct Case {
  Index m, n;
  int tp_dim, tp_size;  // GTP: the rest of the world
};

// The optimizer's layouts through the dispatcher: GTP with padding (the model pads rows to
// ceil(m / G) per rank, as RowSharding does), TP x GTP (tie: distributed over GTP, TP gathered
// first) with and without padding. Padding leaves the last ranks fewer real rows, so distributed
// mode's FLOPs differ per rank: the model prices the busiest rank, compared with the maximum.
// Not covered: TP row splits with padding, whose per-TP-block padding the key does not describe.
TEST(RefinedModelVsCode, ShardedLayoutsThroughTheDispatcher) {
  const Communicator& world = test::world();
  const int g = world.size();
  if (g == 1) GTEST_SKIP() << "a group of one runs the local NS without collectives";
  std::vector<Case> cases = {{45, 32, kNoPartition, 1}, {48, 36, kNoPartition, 1}};
  if (g == 4) {
    cases.push_back({48, 32, 0, 2});
    cases.push_back({48, 32, 1, 2});
    cases.push_back({45, 32, 1, 2});
  }
  NsOptions opts;  // quintic: c != 0 on every step, as the model assumes
  opts.steps = 4;  // the fewest steps the schedule check accepts for quintic
  for (const Case& c : cases) {
    const Matrix full = test::random_matrix(c.m, c.n, 5);
    auto stats = std::make_shared<CommStats>();
    const ProcessGroups pg =
        make_process_groups(counting_communicator(world, stats), c.tp_size, g / c.tp_size);
    ShardLayout layout{.m = c.m, .n = c.n};
    if (c.tp_size > 1) {
      layout.tp_dim = c.tp_dim;
      layout.tp_size = c.tp_size;
      layout.tp_rank = pg.tp.rank();
    }
    layout.gtp_size = pg.gtp_size;
    layout.gtp_rank = pg.gtp.rank();
    layout.pad = (pg.gtp_size - layout.m_tp() % pg.gtp_size) % pg.gtp_size;
    layout.validate("test layout");
    for (const bool syrk : {true, false}) {
      opts.use_syrk = syrk;
      for (const TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed}) {
        SCOPED_TRACE(testing::Message()
                     << c.m << "x" << c.n << " TP " << c.tp_size << " dim " << c.tp_dim << " GTP "
                     << pg.gtp_size << " pad " << layout.pad << " " << to_string(mode) << " syrk "
                     << syrk);
        Matrix shard = local_shard(full, layout);
        stats->reset();
        CountingCompute compute;
        orthogonalize_shard(shard.view(), layout, pg.tp, pg.gtp, mode, opts, {}, compute);
        // The busiest rank's FLOPs (a world all-reduce, after the counted calls).
        double flops = compute.flops;
        const CommStats counted = *stats;
        world.all_reduce(std::span<double>(&flops, 1), ReduceOp::kMax);

        const AutoKey key = auto_key(layout, opts, NsAlgorithm::kStandard, false);
        const CostEstimate est = estimate_refined(key, nullptr);
        expect_counts_match(counted, flops,
                            mode == TpMode::kDuplicated ? est.duplicated : est.distributed);
      }
    }
  }
}

}  // namespace
}  // namespace distmuon
