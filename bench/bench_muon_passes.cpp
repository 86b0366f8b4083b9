// The per-element passes of a Muon step over the training default's Muon weights (1 x 256x512,
// 6 x 2048x256, 6 x 256x2048: 6.4 M parameters; configs/train-default.json), one at a time, and
// a step's whole set of them as the separate operations (Compute's defaults) and as the CPU
// backend's fused passes (Compute::muon_directions, Compute::muon_apply). NS is not included:
// these are the passes every rank runs whatever the replica mode (docs/data-parallel.md).
//
//   build/bin/bench_muon_passes --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "distmuon/compute.h"

namespace {
using namespace distmuon;

struct Weight {
  Matrix g, w, buf, u, next;  // gradient, weight, momentum, direction, the direction after NS
  Matrix scratch;             // the separate passes' copy of the momentum
};

std::vector<Weight>& weights() {
  static std::vector<Weight> all = [] {
    std::vector<Weight> out;
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 0.02f);
    auto make = [&](Index m, Index n) {
      Weight x{Matrix(m, n), Matrix(m, n), Matrix(m, n), Matrix(m, n), Matrix(m, n), Matrix(m, n)};
      for (Matrix* a : {&x.g, &x.w, &x.buf, &x.next})
        for (float& v : a->values())
          v = d(rng);
      out.push_back(std::move(x));
    };
    make(256, 512);
    for (int l = 0; l < 6; ++l) {
      make(2048, 256);
      make(256, 2048);
    }
    return out;
  }();
  return all;
}

const MomentumStep kStep{0.95f, 0.0f, true};
constexpr float kLr = 1e-9f;  // the weights barely move: every round sees like values

enum Pass {
  kFindNonFinite,  // validate_gradients before: g, w and buf checked finite
  kCopy,           // the compute phase's copy of the momentum
  kMomentum,       // muon_momentum (the compute phase's, on the copy; the apply phase's)
  kSumSquares2,    // sum_squares of w and u (the fingerprints; the range check before)
  kAxpby,          // w -= lr u
  kSeparate,       // the whole set as separate passes (before fusing)
  kFused,          // the whole set as the CPU backend's fused passes
};

void BM_muon_passes(benchmark::State& state) {
  Compute& cpu = cpu_compute();
  const auto pass = static_cast<Pass>(state.range(0));
  std::vector<Weight>& all = weights();
  std::vector<std::optional<MatrixIndex>> found(3);
  std::vector<double> sums(2);
  for (auto _ : state) {
    for (Weight& x : all) {
      switch (pass) {
        case kFindNonFinite:
          for (const Matrix* a : {&x.g, &x.w, &x.buf})
            benchmark::DoNotOptimize(cpu.find_non_finite(a->view()));
          break;
        case kCopy:
          cpu.copy(x.buf.view(), x.scratch.view());
          break;
        case kMomentum:
          cpu.muon_momentum(kStep, x.g.view(), x.w.view(), x.scratch.view(), x.u.view());
          break;
        case kSumSquares2:
          benchmark::DoNotOptimize(cpu.sum_squares(x.w.view(), true));
          benchmark::DoNotOptimize(cpu.sum_squares(x.u.view(), true));
          break;
        case kAxpby:
          cpu.axpby(-kLr, x.next.view(), 1.0f, x.w.view());
          break;
        case kSeparate:
          for (const Matrix* a : {&x.g, &x.w, &x.buf})
            benchmark::DoNotOptimize(cpu.find_non_finite(a->view()));
          cpu.copy(x.buf.view(), x.scratch.view());
          cpu.muon_momentum(kStep, x.g.view(), x.w.view(), x.scratch.view(), x.u.view());
          for (const Matrix* a : {&x.w, &x.u, &x.w, &x.next})  // fingerprints, range check
            benchmark::DoNotOptimize(cpu.sum_squares(a->view(), true));
          cpu.muon_momentum(kStep, x.g.view(), x.w.view(), x.buf.view(), x.scratch.view());
          cpu.axpby(-kLr, x.next.view(), 1.0f, x.w.view());
          break;
        case kFused: {
          const MuonDirection d{x.g.view(), x.w.view(), x.buf.view(), x.u.view(), x.g.rows(), true};
          cpu.muon_directions(kStep, {&d, 1}, {}, found, sums);
          benchmark::DoNotOptimize(cpu.sum_squares(x.next.view(), true));
          cpu.muon_apply(kStep, x.g.view(), x.w.view(), x.buf.view(), x.next.view(), 1.0f, kLr);
          break;
        }
      }
    }
  }
}

}  // namespace

BENCHMARK(BM_muon_passes)
    ->ArgName("pass")
    ->DenseRange(kFindNonFinite, kFused)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
