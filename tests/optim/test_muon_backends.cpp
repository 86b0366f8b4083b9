// Muon on backend-owned memory: every mode (blockwise, duplicated, distributed, owner), both NS
// algorithms, every layout of the optimizer tests (TP, GTP, TP x GTP, padding, QKV) and an expert
// weight on its own groups, run on the opaque backend (memory the host cannot address, so any
// host access to the weights, gradients, state or scratch faults) and on the CPU backend.
//  - Bit-equal (tolerance 0): the opaque backend runs the CPU backend's arithmetic on its own
//    storage, so the weights and the optimizer state after several steps must be identical.
//  - No allocation after step 1: steps 2..5 leave the backend's allocation count unchanged
//    (every buffer is kept per shape), on both backends.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <string>

#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

using test::TestLayout;

constexpr int kSteps = 5;

struct RunResult {
  std::vector<Matrix> initial, weights, state;  // host copies before and after the steps
  std::size_t allocations_after_step1 = 0, allocations_after_last = 0;
};

bool bit_equal(const Matrix& a, const Matrix& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  for (Index k = 0; k < a.size(); ++k)
    if (a.data()[k] != b.data()[k]) return false;
  return true;
}

bool all_zero(const Matrix& a) {
  for (const float v : a.values())
    if (v != 0.0f) return false;
  return true;
}

// One optimizer holding every layout of the world (plus an expert weight and an AdamW gain) on
// `backend`: weights and gradients live in its memory (uploaded from host shards), kSteps steps.
RunResult run_on(const std::string& backend, TpMode mode, NsAlgorithm algorithm) {
  Compute& compute = compute_backend(backend);
  const Communicator& world = test::world();
  const int w = world.size();
  std::vector<TestLayout> layouts = test::layouts_for(w);
  const int egtp = w >= 2 ? 2 : 1;
  layouts.push_back({.label = "expert", .m = 36, .n = 12, .gtp = egtp});
  const int ep_rank = world.rank() / egtp;

  MuonOptions o;
  o.tp_mode = mode;
  o.ns_algorithm = algorithm;
  o.weight_decay = 0.05;
  Muon opt(o, world, compute);
  RunResult out;
  std::map<std::pair<int, int>, ProcessGroups> groups;  // per (tp, gtp), made in the same order
  std::vector<const ProcessGroups*> pg;
  std::vector<DeviceMatrix> local, grads;
  std::uint64_t seed = 500;
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const TestLayout& l = layouts[i];
    auto it = groups.find({l.tp, l.gtp});
    if (it == groups.end())
      it = groups.emplace(std::pair(l.tp, l.gtp), make_process_groups(world, l.tp, l.gtp)).first;
    pg.push_back(&it->second);
    const bool expert = l.label == "expert";
    const Matrix init = test::shard_for(
        test::random_matrix(l.m, l.n, seed++ + (expert ? 1000 * ep_rank : 0)).view(), l,
        it->second.tp.rank(), it->second.gtp.rank());
    local.push_back(to_device(compute, init.view()));
    out.initial.push_back(init);
    ParamSpec s = test::layout_spec(l, it->second, local.back().view(), fmt::format("w{}", i));
    s.expert = expert;
    s.expert_rank = expert ? ep_rank : 0;
    opt.add_parameter(s);
  }
  const Matrix gain = test::random_matrix(6, 1, seed++);
  local.push_back(to_device(compute, gain.view()));
  out.initial.push_back(gain);
  ParamSpec g;
  g.name = "gain";
  g.local = local.back().view();
  g.rows = 6;
  g.cols = 1;
  g.role = ParamRole::kOther;
  opt.add_parameter(g);
  // The gradients' memory, allocated once (the optimizer's allocations are what is counted).
  for (const DeviceMatrix& x : local)
    grads.emplace_back(compute, x.rows(), x.cols());

  for (int step = 0; step < kSteps; ++step) {
    std::vector<ConstMatrixView> views;
    for (std::size_t i = 0; i < local.size(); ++i) {
      Matrix host;
      if (i < layouts.size()) {
        const TestLayout& l = layouts[i];
        const bool expert = l.label == "expert";
        const auto s = 100 * static_cast<std::uint64_t>(step) + i + (expert ? 10000 * ep_rank : 0);
        // Padding rows of the gradients are garbage: the optimizer must ignore them.
        host = test::shard_for(test::random_matrix(l.m, l.n, s).view(), l, pg[i]->tp.rank(),
                               pg[i]->gtp.rank(), 3.0f);
      } else {
        host = test::random_matrix(6, 1, 900 + static_cast<std::uint64_t>(step));
      }
      compute.copy_from_host(host.view(), grads[i].view());
      views.push_back(grads[i].view());
    }
    opt.step(views);
    if (step == 0) out.allocations_after_step1 = compute.memory_stats().allocations;
  }
  out.allocations_after_last = compute.memory_stats().allocations;
  for (std::size_t i = 0; i < local.size(); ++i) {
    out.weights.push_back(to_host(compute, local[i].view()));
    for (const MatrixView& t : opt.state_tensors(i))
      out.state.push_back(to_host(compute, t));
  }
  return out;
}

TEST(MuonBackends, OpaqueIsBitEqualToCpuAndStepsDoNotAllocate) {
  for (const TpMode mode :
       {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed, TpMode::kOwner}) {
    for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
      const std::string what =
          fmt::format("{} {} rank {}", to_string(mode), to_string(algorithm), test::world().rank());
      const RunResult cpu = run_on("cpu", mode, algorithm);
      const RunResult opaque = run_on("opaque", mode, algorithm);
      EXPECT_EQ(cpu.allocations_after_last, cpu.allocations_after_step1) << "cpu " << what;
      EXPECT_EQ(opaque.allocations_after_last, opaque.allocations_after_step1) << "opaque " << what;
      ASSERT_EQ(cpu.weights.size(), opaque.weights.size());
      ASSERT_EQ(cpu.state.size(), opaque.state.size());
      for (std::size_t i = 0; i < cpu.weights.size(); ++i) {
        EXPECT_TRUE(bit_equal(cpu.weights[i], opaque.weights[i])) << what << " weight " << i;
        // The steps did update every weight (a shard of padding rows only stays zero).
        if (!all_zero(cpu.initial[i]))
          EXPECT_FALSE(bit_equal(cpu.weights[i], cpu.initial[i])) << what << " weight " << i;
      }
      for (std::size_t i = 0; i < cpu.state.size(); ++i)
        EXPECT_TRUE(bit_equal(cpu.state[i], opaque.state[i])) << what << " state " << i;
    }
  }
}

TEST(MuonBackends, HostMemoryOnADeviceBackendIsRefused) {
  // Host memory where the opaque backend's belongs is refused by the first operation on it (the
  // batched gradient check), on every rank together: CollectiveError naming the reason.
  Compute& opaque = compute_backend("opaque");
  Matrix host(4, 6);
  Muon opt(MuonOptions{.tp_mode = TpMode::kDuplicated}, test::world(), opaque);
  ParamSpec s;
  s.name = "host";
  s.local = host.view();
  s.rows = 4;
  s.cols = 6;
  opt.add_parameter(s);
  const Matrix g = test::random_matrix(4, 6, 3);
  const ConstMatrixView grads[] = {g.view()};
  try {
    opt.step(grads);
    FAIL() << "host gradients on the opaque backend";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("not memory of this backend"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace distmuon
