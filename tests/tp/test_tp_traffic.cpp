// What each TP mode sends, counted by the counting communicator over the real group, against the
// closed form tp_traffic() that the cost model reuses; and tp_flops().
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "distmuon/error.h"
#include "distmuon/tp.h"
#include "test_util.h"
#include "tp_test_util.h"

namespace distmuon {
namespace {

using test::my_shard;
using test::ns_options;
using test::random_matrix;
using test::tp_groups;

TpTraffic counted(const CommStats& s) {
  return {s.all_gather.calls, s.all_gather.bytes, s.all_reduce.calls, s.all_reduce.bytes};
}

std::string str(const TpTraffic& t) {
  return fmt::format("all_gather {} calls {} B, all_reduce {} calls {} B", t.all_gather_calls,
                     t.all_gather_bytes, t.all_reduce_calls, t.all_reduce_bytes);
}

TEST(TpTraffic, CountedCollectivesMatchTheClosedForm) {
  struct Case {
    Index m, n;
    int dim;
    std::string set;
    bool syrk;
  };
  const Case cases[] = {{64, 40, 0, "quintic", true},
                        {64, 40, 1, "cubic5", false},
                        {40, 64, 0, "polar_express", true},
                        {40, 64, 1, "quintic", false}};
  for (const Communicator& group : tp_groups()) {
    auto stats = std::make_shared<CommStats>();
    const Communicator c = counting_communicator(group, stats);
    for (const Case& k : cases) {
      const NsOptions o = ns_options(k.set, k.syrk);
      const Matrix full = random_matrix(k.m, k.n, 9);
      for (TpMode mode : {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed}) {
        Matrix shard = my_shard(full.view(), k.dim, c);
        newton_schulz_tp(shard.view(), k.dim, c, mode, o, cpu_compute());  // warm-up
        stats->reset();
        shard = my_shard(full.view(), k.dim, c);
        newton_schulz_tp(shard.view(), k.dim, c, mode, o, cpu_compute());
        TpTraffic expected = tp_traffic(k.m, k.n, c.size(), k.dim, mode, o.steps);
        if (c.size() > 1 && mode != TpMode::kBlockwise) {  // the shape check, on every call
          expected.all_reduce_calls += 1;
          expected.all_reduce_bytes += 3 * 8;
        }
        if (c.size() > 1) {  // the agreement on the result's check (an int32 per rank)
          expected.all_gather_calls += 1;
          expected.all_gather_bytes += 4 * static_cast<std::size_t>(c.size());
        }
        EXPECT_EQ(counted(*stats), expected)
            << "G=" << c.size() << " " << shape_str(k.m, k.n) << " dim " << k.dim << " "
            << to_string(mode) << ": counted " << str(counted(*stats)) << ", expected "
            << str(expected);
        EXPECT_EQ(stats->broadcast.calls + stats->reduce_scatter.calls + stats->barrier.calls, 0u);
      }
    }
  }
}

TEST(TpTraffic, ShapeCheckRunsOnEveryCall) {
  for (const Communicator& group : tp_groups()) {
    auto stats = std::make_shared<CommStats>();
    const Communicator c = counting_communicator(group, stats);
    const Matrix full = random_matrix(32, 48, 2);
    const NsOptions o = ns_options("quintic", true);
    const auto g = static_cast<std::size_t>(c.size());
    // The check: one all-reduce of three 64-bit integers (agreement.h's all_agree), on every
    // call, the same shape again and in another mode included: a check skipped on the ranks that
    // saw a shape before would hang against a rank holding a new one.
    const std::size_t check_calls = g > 1 ? 1 : 0, check_bytes = g > 1 ? 3 * 8 : 0;
    for (TpMode mode : {TpMode::kDuplicated, TpMode::kDuplicated, TpMode::kDistributed}) {
      stats->reset();
      Matrix shard = my_shard(full.view(), 1, c);
      newton_schulz_tp(shard.view(), 1, c, mode, o, cpu_compute());
      const TpTraffic t = tp_traffic(32, 48, c.size(), 1, mode, o.steps);
      // Plus the agreement on the result's check: one all-gather of an int32 per rank.
      const std::size_t agree_calls = g > 1 ? 1 : 0, agree_bytes = g > 1 ? 4 * g : 0;
      EXPECT_EQ(stats->all_gather.calls, t.all_gather_calls + agree_calls) << to_string(mode);
      EXPECT_EQ(stats->all_gather.bytes, t.all_gather_bytes + agree_bytes) << to_string(mode);
      EXPECT_EQ(stats->all_reduce.calls, t.all_reduce_calls + check_calls) << to_string(mode);
      EXPECT_EQ(stats->all_reduce.bytes, t.all_reduce_bytes + check_bytes) << to_string(mode);
    }
  }
}

TEST(TpTraffic, ClosedFormValues) {
  // Written out from the definition: duplicated gathers the matrix, distributed all-reduces an
  // s x s fp32 Gram per step (s = n for rows split, m for columns split) plus one double.
  EXPECT_EQ(tp_traffic(4096, 1024, 2, 0, TpMode::kDuplicated, 5),
            (TpTraffic{1, 4096u * 1024 * 4, 0, 0}));
  EXPECT_EQ(tp_traffic(4096, 1024, 2, 0, TpMode::kDistributed, 5),
            (TpTraffic{0, 0, 6, 5u * 1024 * 1024 * 4 + 8}));
  EXPECT_EQ(tp_traffic(4096, 1024, 4, 1, TpMode::kDistributed, 5),
            (TpTraffic{0, 0, 6, 5u * 4096 * 4096 * 4 + 8}));
  EXPECT_EQ(tp_traffic(1024, 4096, 8, 1, TpMode::kDuplicated, 5, 2),
            (TpTraffic{1, 1024u * 4096 * 2, 0, 0}));
  EXPECT_EQ(tp_traffic(4096, 1024, 2, 0, TpMode::kBlockwise, 5), TpTraffic{});
  EXPECT_EQ(tp_traffic(4096, 1024, 1, 0, TpMode::kDistributed, 5), TpTraffic{});
  EXPECT_EQ(tp_traffic(4096, 1024, 2, kNoPartition, TpMode::kDuplicated, 5), TpTraffic{});
  EXPECT_THROW(tp_traffic(4096, 1023, 2, 1, TpMode::kDuplicated, 5), Error);
  EXPECT_THROW(tp_traffic(64, 64, 2, 0, TpMode::kAuto, 5), Error);
}

TEST(TpLocalNs, TheProblemEachRankIterates) {
  const auto check = [](TpLocalNs got, Index rows, Index cols, GramSide side) {
    EXPECT_EQ(got.rows, rows);
    EXPECT_EQ(got.cols, cols);
    EXPECT_EQ(got.side, side);
  };
  check(tp_local_ns(1024, 4096, 2, 0, TpMode::kDistributed), 512, 4096, GramSide::kCols);
  check(tp_local_ns(1024, 4096, 2, 1, TpMode::kDistributed), 1024, 2048, GramSide::kRows);
  check(tp_local_ns(1024, 4096, 2, 0, TpMode::kDuplicated), 1024, 4096, GramSide::kRows);
  check(tp_local_ns(4096, 1024, 4, 0, TpMode::kBlockwise), 1024, 1024, GramSide::kRows);
  check(tp_local_ns(4096, 1024, 2, 0, TpMode::kBlockwise), 2048, 1024, GramSide::kCols);
  check(tp_local_ns(4096, 1024, 2, 0, TpMode::kBlockwise, GramSide::kRows), 2048, 1024,
        GramSide::kRows);
  check(tp_local_ns(4096, 1024, 1, 0, TpMode::kDistributed), 4096, 1024, GramSide::kCols);
  check(tp_local_ns(4096, 1024, 2, kNoPartition, TpMode::kDistributed), 4096, 1024,
        GramSide::kCols);
  EXPECT_EQ(tp_local_ns(1024, 4096, 2, 0, TpMode::kDistributed).gram_dim(), 4096);
  EXPECT_EQ(tp_local_ns(1024, 4096, 2, 0, TpMode::kDistributed).long_dim(), 512);
}

TEST(TpFlops, EachModeCountsTheMatrixItIterates) {
  NsOptions o = ns_options("quintic", true);
  // Distributed, rows split: shard (m / G) x n with the Gram on the columns (n x n).
  EXPECT_DOUBLE_EQ(tp_flops(4096, 1024, 2, 0, TpMode::kDistributed, o),
                   ns_flops(2048, 1024, 5, true, GramSide::kCols, &o.coefficients));
  // A wide matrix split by rows: the Gram is the larger n x n one.
  EXPECT_DOUBLE_EQ(tp_flops(1024, 4096, 2, 0, TpMode::kDistributed, o),
                   ns_flops(512, 4096, 5, true, GramSide::kCols, &o.coefficients));
  EXPECT_DOUBLE_EQ(tp_flops(1024, 4096, 4, 1, TpMode::kDistributed, o),
                   ns_flops(1024, 1024, 5, true, GramSide::kRows, &o.coefficients));
  EXPECT_DOUBLE_EQ(tp_flops(1024, 4096, 2, 0, TpMode::kDuplicated, o),
                   ns_flops(1024, 4096, 5, true));
  EXPECT_DOUBLE_EQ(tp_flops(1024, 4096, 2, 1, TpMode::kBlockwise, o),
                   ns_flops(1024, 2048, 5, true));
  EXPECT_DOUBLE_EQ(tp_flops(1024, 4096, 1, 0, TpMode::kDistributed, o),
                   ns_flops(1024, 4096, 5, true));
  // cubic5 (c = 0) has no A A product; gemm instead of syrk doubles the symmetric products.
  const NsOptions cubic = ns_options("cubic5", false);
  EXPECT_DOUBLE_EQ(tp_flops(512, 256, 2, 0, TpMode::kDistributed, cubic),
                   5 * (2.0 * 256 * 256 * 256 + 2.0 * 256 * 256 * 256));
}

}  // namespace
}  // namespace distmuon
