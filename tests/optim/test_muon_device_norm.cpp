// Newton-Schulz's normalisation on a device backend (Compute::normalize, compute.h), through Muon:
//  - no host read of a norm: a Muon step on a device backend calls the single-matrix sum_squares
//    zero times (a counting decorator over the opaque backend; the opaque backend cannot show a
//    synchronisation, so the calls that would need one are counted instead), and checks its
//    results with two batched find_non_finite calls per step (the gradients before the updates,
//    the Muon weights after them), whatever the number of weights, and bounds its AdamW
//    parameters' second moments with one batched sum_squares per step (adamw_overflow);
//  - a non-finite Newton-Schulz input (a NaN in the momentum state, or in a weight with L2 weight
//    decay) makes the step throw CollectiveError on every rank before any update, naming the
//    weight, also when only one rank holds the bad value of a weight it does not share.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <limits>
#include <map>
#include <memory>
#include <string>

#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

// Forwards every operation to an opaque backend and counts the reductions.
class CountingOpaque final : public Compute {
 public:
  std::map<std::string, int> calls;
  std::string name() const override { return "counting-opaque"; }
  MemoryKind memory() const override { return inner_->memory(); }
  void copy_from_host(ConstMatrixView host, MatrixView dst) override {
    inner_->copy_from_host(host, dst);
  }
  void copy_to_host(ConstMatrixView src, MatrixView host) override {
    inner_->copy_to_host(src, host);
  }
  Communicator data_communicator(const Communicator& host) override {
    return inner_->data_communicator(host);
  }
  void do_gemm(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b, float beta,
               MatrixView c, Precision precision) override {
    inner_->gemm(ta, tb, alpha, a, b, beta, c, precision);
  }
  void do_syrk(Trans ta, float alpha, ConstMatrixView a, float beta, MatrixView c,
               Precision precision) override {
    inner_->syrk(ta, alpha, a, beta, c, precision);
  }
  double sum_squares(ConstMatrixView a, bool in_double) override {
    ++calls["sum_squares"];
    return inner_->sum_squares(a, in_double);
  }
  void sum_squares(std::span<const ConstMatrixView> as, bool in_double,
                   std::span<double> out) override {
    ++calls["sum_squares batched"];
    inner_->sum_squares(as, in_double, out);
  }
  std::optional<double> normalize(MatrixView x, double eps, bool in_double,
                                  const Communicator* group) override {
    ++calls["normalize"];
    return inner_->normalize(x, eps, in_double, group);
  }
  void scale(MatrixView a, float alpha) override { inner_->scale(a, alpha); }
  void axpby(float alpha, ConstMatrixView x, float beta, MatrixView y) override {
    inner_->axpby(alpha, x, beta, y);
  }
  void add_diagonal(MatrixView a, float alpha) override { inner_->add_diagonal(a, alpha); }
  void round(MatrixView a, Precision precision) override { inner_->round(a, precision); }
  void pack_bf16(ConstMatrixView a, float* dst) override { inner_->pack_bf16(a, dst); }
  void unpack_bf16(const float* src, MatrixView a) override { inner_->unpack_bf16(src, a); }
  void fill(MatrixView a, float value) override { inner_->fill(a, value); }
  void copy(ConstMatrixView src, MatrixView dst) override { inner_->copy(src, dst); }
  std::optional<MatrixIndex> find_non_finite(ConstMatrixView a) override {
    ++calls["find_non_finite"];
    return inner_->find_non_finite(a);
  }
  void find_non_finite(std::span<const ConstMatrixView> as,
                       std::span<std::optional<MatrixIndex>> out) override {
    ++calls["find_non_finite batched"];
    inner_->find_non_finite(as, out);
  }
  void muon_momentum(const MomentumStep& k, ConstMatrixView g, ConstMatrixView w, MatrixView buf,
                     MatrixView u) override {
    inner_->muon_momentum(k, g, w, buf, u);
  }
  void adamw(const AdamWStep& k, ConstMatrixView g, MatrixView m, MatrixView v,
             MatrixView p) override {
    inner_->adamw(k, g, m, v, p);
  }

 protected:
  float* do_allocate(std::size_t count) override { return inner_->allocate(count); }
  void do_release(float* data, std::size_t count) noexcept override {
    inner_->release(data, count);
  }

 private:
  std::unique_ptr<Compute> inner_ = make_opaque_compute();
};

// Two Muon weights (one sharded by rows over the world, one replicated on every rank), an AdamW
// gain, their memory on `compute`.
struct Model {
  std::vector<test::TestLayout> layouts;
  std::vector<ProcessGroups> groups;
  std::vector<DeviceMatrix> local, grads;
  std::vector<ParamSpec> specs;

  Model(Compute& compute, const Communicator& world) {
    const int w = world.size();
    layouts = {{.label = "sharded", .m = 16, .n = 12, .gtp = w},
               {.label = "replicated", .m = 10, .n = 14}};
    std::uint64_t seed = 70;
    for (const test::TestLayout& l : layouts) {
      groups.push_back(make_process_groups(world, l.tp, l.gtp));
      const Matrix init = test::shard_for(test::random_matrix(l.m, l.n, seed++).view(), l,
                                          groups.back().tp.rank(), groups.back().gtp.rank());
      local.push_back(to_device(compute, init.view()));
    }
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      specs.push_back(
          test::layout_spec(layouts[i], groups[i], local[i].view(), "w_" + layouts[i].label));
    }
    local.push_back(to_device(compute, test::random_matrix(6, 1, seed++).view()));
    ParamSpec gain;
    gain.name = "gain";
    gain.local = local.back().view();
    gain.rows = 6;
    gain.cols = 1;
    gain.role = ParamRole::kOther;
    specs.push_back(gain);
    for (const DeviceMatrix& x : local)
      grads.emplace_back(compute, x.rows(), x.cols());
  }

  std::vector<ConstMatrixView> gradients(Compute& compute, int step) {
    std::vector<ConstMatrixView> views;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const Matrix g = test::random_matrix(grads[i].rows(), grads[i].cols(), 300 + 10 * step + i);
      compute.copy_from_host(g.view(), grads[i].view());
      views.push_back(grads[i].view());
    }
    return views;
  }
};

Muon make_muon(const MuonOptions& o, Compute& compute, Model& model) {
  Muon opt(o, test::world(), compute);
  for (const ParamSpec& s : model.specs)
    opt.add_parameter(s);
  return opt;
}

TEST(DeviceNorm, MuonStepReadsNoNormOnTheHost) {
  const Communicator& world = test::world();
  for (const TpMode mode :
       {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed, TpMode::kOwner}) {
    for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
      const std::string what = fmt::format("{} {}", to_string(mode), to_string(algorithm));
      CountingOpaque compute;
      Model model(compute, world);
      MuonOptions o;
      o.tp_mode = mode;
      o.ns_algorithm = algorithm;
      Muon opt = make_muon(o, compute, model);
      constexpr int kSteps = 3;
      for (int step = 0; step < kSteps; ++step)
        opt.step(model.gradients(compute, step));
      EXPECT_EQ(compute.calls["sum_squares"], 0) << what;
      // Two batched reads per step: the gradients, weights and states checked finite before it
      // (find_non_finite), and at the end of the compute phase one sum of squares of every
      // update, weight and AdamW state (the updates finite, AdamW's second moment and the new
      // weights within float32's range: check_updates), not a norm of Newton-Schulz.
      EXPECT_EQ(compute.calls["sum_squares batched"], kSteps) << what;
      EXPECT_EQ(compute.calls["find_non_finite"], 0) << what;
      EXPECT_EQ(compute.calls["find_non_finite batched"], kSteps) << what;
      // The norms were taken (on the device): at least one NS per step on this rank (owner mode
      // runs NS only for the weights this rank owns).
      if (mode != TpMode::kOwner) {
        EXPECT_GE(compute.calls["normalize"], 2 * kSteps) << what;
      }
      EXPECT_GT(world.all_reduce(compute.calls["normalize"]), 0) << what;
    }
  }
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A NaN at (0, 0) of a tensor in the backend's memory.
void poison(Compute& compute, MatrixView x) {
  Matrix host = to_host(compute, x);
  host(0, 0) = kNaN;
  compute.copy_from_host(host.view(), x);
}

// The step throws CollectiveError on every rank (every rank reaches the EXPECT, none hangs),
// naming the weight.
void expect_step_fails(Muon& opt, Model& model, Compute& compute, const std::string& weight,
                       const std::string& what) {
  try {
    opt.step(model.gradients(compute, 0));
    ADD_FAILURE() << what << ": step did not throw";
  } catch (const CollectiveError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'" + weight + "'"), std::string::npos) << what << ": " << m;
    // Found by the step's first batched check, of the gradients, weights and states, before any
    // update (the check of the updates remains for a momentum step that overflows).
    EXPECT_NE(m.find("before the step (nothing is updated)"), std::string::npos)
        << what << ": " << m;
  }
}

TEST(DeviceNorm, NonFiniteMomentumThrowsOnEveryRank) {
  const Communicator& world = test::world();
  Compute& compute = compute_backend("opaque");
  for (const TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kOwner}) {
    Model model(compute, world);
    MuonOptions o;
    o.tp_mode = mode;
    Muon opt = make_muon(o, compute, model);
    opt.step(model.gradients(compute, 1));  // a finite step first
    // Rank 0's momentum shard of the sharded weight: its NS input on every rank is not finite.
    if (world.rank() == 0) poison(compute, opt.state_tensors(0).at(0));
    expect_step_fails(opt, model, compute, "w_sharded", to_string(mode));
  }
}

TEST(DeviceNorm, NonFiniteWeightWithL2DecayThrowsOnEveryRank) {
  const Communicator& world = test::world();
  Compute& compute = compute_backend("opaque");
  Model model(compute, world);
  MuonOptions o;
  o.tp_mode = TpMode::kDuplicated;
  o.weight_decay = 0.01;
  o.weight_decay_method = WeightDecayMethod::kL2;
  Muon opt = make_muon(o, compute, model);
  // The replicated weight on the last rank only: the other ranks find nothing of their own and
  // still throw (the outcome is agreed over the world).
  if (world.rank() == world.size() - 1) poison(compute, model.local[1].view());
  expect_step_fails(opt, model, compute, "w_replicated", "L2");
}

// The CPU backend refuses the same input before any update too (the step's first check).
TEST(DeviceNorm, CpuRefusesTheInputBeforeTheUpdate) {
  Compute& compute = cpu_compute();
  Model model(compute, local_communicator());
  MuonOptions o;
  o.weight_decay = 0.01;
  o.weight_decay_method = WeightDecayMethod::kL2;
  Muon opt(o, local_communicator(), compute);
  for (const ParamSpec& s : model.specs)
    opt.add_parameter(s);
  poison(compute, model.local[1].view());
  const Matrix before = to_host(compute, model.local[1].view());
  EXPECT_THROW(opt.step(model.gradients(compute, 0)), Error);
  const Matrix after = to_host(compute, model.local[1].view());
  for (Index k = 1; k < before.size(); ++k)
    EXPECT_EQ(after.data()[k], before.data()[k]) << k;  // not updated
}

}  // namespace
}  // namespace distmuon
