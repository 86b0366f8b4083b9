// Muon runs every operation on its matrices through the Compute it is given: a counting
// decorator over the CPU backend sees the momentum step, the AdamW step, the gradient check,
// the products and (sharded modes) the copies, and the result is bit-equal to Muon on the
// default backend (the same arithmetic in the same order, so tolerance 0).
#include <gtest/gtest.h>

#include <string>

#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "distmuon/tp.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

using test::CountingCompute;

bool bit_equal(const Matrix& a, const Matrix& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  for (Index k = 0; k < a.size(); ++k)
    if (a.data()[k] != b.data()[k]) return false;
  return true;
}

// A hidden 16 x 24 weight TP-split by rows over the world, and a 6 x 1 AdamW parameter; three
// steps. Returns both parameters' local values.
std::pair<Matrix, Matrix> run(TpMode mode, Compute* compute) {
  const Communicator& world = test::world();
  const ProcessGroups groups = make_process_groups(world, world.size(), 1);
  test::TestLayout l;
  l.m = 16;
  l.n = 24;
  l.tp_dim = 0;
  l.tp = world.size();
  MuonOptions o;
  o.tp_mode = mode;
  o.ns_algorithm = NsAlgorithm::kStandard;
  o.weight_decay = 0.1;
  Muon muon = compute != nullptr ? Muon(o, world, *compute) : Muon(o, world, cpu_compute());
  Matrix w = test::shard_for(test::random_matrix(16, 24, 1).view(), l, groups.tp.rank(), 0);
  Matrix bias = test::random_matrix(6, 1, 2);
  muon.add_parameter(test::layout_spec(l, groups, w.view(), "w"));
  ParamSpec b;
  b.name = "bias";
  b.local = bias.view();
  b.rows = 6;
  b.cols = 1;
  b.role = ParamRole::kOther;
  muon.add_parameter(b);
  for (int step = 0; step < 3; ++step) {
    const Matrix gw =
        test::shard_for(test::random_matrix(16, 24, 10 + step).view(), l, groups.tp.rank(), 0);
    const Matrix gb = test::random_matrix(6, 1, 20 + step);
    const ConstMatrixView grads[] = {gw.view(), gb.view()};
    muon.step(grads);
  }
  return {std::move(w), std::move(bias)};
}

TEST(MuonCompute, EveryOperationGoesThroughTheGivenBackend) {
  const bool sharded = test::world().size() > 1;
  for (const TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kOwner}) {
    SCOPED_TRACE(to_string(mode));
    CountingCompute counting;
    const auto [w, bias] = run(mode, &counting);
    const auto [w_ref, bias_ref] = run(mode, nullptr);
    EXPECT_TRUE(bit_equal(w, w_ref));
    EXPECT_TRUE(bit_equal(bias, bias_ref));
    // Twice a step: on a copy of the momentum in the compute phase, on the momentum itself once
    // the step's updates are agreed finite (the apply phase).
    EXPECT_EQ(counting.calls["muon_momentum"], 2 * 3);
    EXPECT_EQ(counting.calls["adamw"], 3);
    // Every step: both gradients, both weights, the momentum and the two AdamW moments before
    // the step (the updates at the end of the compute phase by their sums of squares).
    EXPECT_EQ(counting.calls["find_non_finite"], 3 * 7);
    // The products of NS: on every rank, except in owner mode, where only the owner runs NS.
    const double products = counting.calls["syrk"] + counting.calls["gemm"];
    EXPECT_GT(mode == TpMode::kOwner ? test::world().all_reduce(products) : products, 0);
    EXPECT_GE(counting.calls["axpby"], 3);  // at least the update of every step
    EXPECT_GE(counting.calls["scale"], 3);  // weight decay of every step
    // Duplicated and owner modes copy this rank's slice back from the gathered matrix.
    if (sharded && mode != TpMode::kDistributed) EXPECT_GT(counting.calls["copy"], 0);
  }
}

}  // namespace
}  // namespace distmuon
