// The refined model counts what newton_schulz_tp really does: its collectives and payload bytes
// (the counting communicator) and its FLOPs (a counting compute backend), for both modes and both
// partition dims. Exact equality: all counts are integers well inside double's range.
#include <gtest/gtest.h>

#include <memory>

#include "distmuon/cost_model.h"
#include "distmuon/tp.h"
#include "test_util.h"

namespace distmuon {
namespace {

// Forwards to the CPU backend and counts FLOPs as ns_flops does: gemm 2 m n k, syrk n^2 k.
class CountingCompute final : public Compute {
 public:
  double flops = 0;
  std::string name() const override { return "counting"; }
  void gemm(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b, float beta,
            MatrixView c) override {
    flops += 2.0 * c.rows * c.cols * (ta == Trans::kNo ? a.cols : a.rows);
    (void)tb;
    cpu_compute().gemm(ta, tb, alpha, a, b, beta, c);
  }
  void syrk(Trans ta, float alpha, ConstMatrixView a, float beta, MatrixView c) override {
    flops += 1.0 * c.rows * c.cols * (ta == Trans::kNo ? a.cols : a.rows);
    cpu_compute().syrk(ta, alpha, a, beta, c);
  }
  double sum_squares(ConstMatrixView a, bool in_double) override {
    return cpu_compute().sum_squares(a, in_double);
  }
  void scale(MatrixView a, float alpha) override { cpu_compute().scale(a, alpha); }
  void axpby(float alpha, ConstMatrixView x, float beta, MatrixView y) override {
    cpu_compute().axpby(alpha, x, beta, y);
  }
  void add_diagonal(MatrixView a, float alpha) override { cpu_compute().add_diagonal(a, alpha); }
  void fill(MatrixView a, float value) override { cpu_compute().fill(a, value); }
  void copy(ConstMatrixView src, MatrixView dst) override { cpu_compute().copy(src, dst); }
  std::optional<MatrixIndex> find_non_finite(ConstMatrixView a) override {
    return cpu_compute().find_non_finite(a);
  }
  void muon_momentum(const MomentumStep& k, ConstMatrixView g, ConstMatrixView w, MatrixView buf,
                     MatrixView u) override {
    cpu_compute().muon_momentum(k, g, w, buf, u);
  }
  void adamw(const AdamWStep& k, ConstMatrixView g, MatrixView m, MatrixView v,
             MatrixView p) override {
    cpu_compute().adamw(k, g, m, v, p);
  }
};

TEST(RefinedModelVsCode, CollectivesBytesAndFlopsMatchTheCode) {
  const Communicator& world = test::world();
  const int g = world.size();
  if (g == 1) GTEST_SKIP() << "a group of one runs the local NS without collectives";
  NsOptions opts;  // quintic: c != 0 on every step, as the model assumes
  opts.steps = 3;
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
        newton_schulz_tp(shard.view(), dim, group, mode,
                         opts);  // first call also checks the shard shapes
        stats->reset();
        shard = shard_of(full.view(), dim, g, world.rank());
        CountingCompute compute;
        newton_schulz_tp(shard.view(), dim, group, mode, opts, compute);

        const AutoKey key{.m = 48,
                          .n = 32,
                          .group_size = g,
                          .partition_dim = dim,
                          .steps = opts.steps,
                          .use_syrk = syrk,
                          .elem_size = 4};
        const CostEstimate est = estimate_refined(key, nullptr);
        const ModeCost& c = mode == TpMode::kDuplicated ? est.duplicated : est.distributed;
        EXPECT_EQ(stats->all_gather.calls, static_cast<std::size_t>(c.all_gathers));
        EXPECT_EQ(stats->all_reduce.calls, static_cast<std::size_t>(c.all_reduces));
        EXPECT_EQ(static_cast<double>(stats->all_gather.bytes + stats->all_reduce.bytes),
                  c.payload_bytes);
        EXPECT_EQ(compute.flops, c.flops);
      }
    }
  }
}

}  // namespace
}  // namespace distmuon
