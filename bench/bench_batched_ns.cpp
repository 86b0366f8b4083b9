// Batched Newton-Schulz on the CPU backend: a batch of equal-shaped matrices (a layer's experts)
// orthogonalised as one batch (run_newton_schulz_batch: each NS product one batched call, which
// the CPU backend runs matrix by matrix: a loop per product) against the whole NS of one matrix
// after the other (run_newton_schulz per matrix), in the same run. Both give the same bits.
//
// Arguments: matrices, rows, columns, batched (1) or per matrix (0), scattered (1: each matrix its
// own allocation, as separate weights of one shape are; the batch is staged into one equally
// strided buffer and back) or stacked (0: a batched parameter's slices). Counter: per_matrix (the
// time per matrix). The CPU backend's optimizer runs the per-matrix form
// (Compute::batches_newton_schulz).
//   build/bin/bench_batched_ns --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <vector>

#include "distmuon/compute.h"
#include "distmuon/newton_schulz.h"
#include "ns/batched_newton_schulz.h"
#include "ns/ns_steps.h"

namespace {

using namespace distmuon;

void BM_experts(benchmark::State& state) {
  const auto count = static_cast<Index>(state.range(0));
  const Index m = state.range(1), n = state.range(2);
  const bool batched = state.range(3) != 0;
  const bool scattered = state.range(4) != 0;
  Compute& cpu = cpu_compute();
  Matrix source(count * m, n);
  std::uint64_t x = 88172645463325252ull;
  for (float& v : source.values()) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = static_cast<float>(static_cast<double>(x % 2000) / 1000.0 - 1.0);
  }
  DeviceMatrix work(cpu, count * m, n);
  std::vector<MatrixView> xs;
  std::vector<DeviceMatrix> apart;  // scattered: each matrix its own allocation
  for (Index i = 0; i < count; ++i) {
    if (scattered) {
      apart.emplace_back(cpu, m, n);
      xs.push_back(apart.back().view());
    } else {
      xs.push_back(work.view().row_block(i * m, m));
    }
  }
  NsOptions ns;
  NsWorkspace batch_ws;
  std::vector<NsWorkspace> one_ws(1);
  for (auto _ : state) {
    // The same input every iteration (every variant).
    for (Index i = 0; i < count; ++i)
      cpu.copy(source.view().row_block(i * m, m), xs[static_cast<std::size_t>(i)]);
    if (batched) {
      detail::run_newton_schulz_batch(xs, ns, cpu, &batch_ws, detail::NormCheck::kBackend);
    } else {
      for (const MatrixView& v : xs)
        detail::run_newton_schulz(v, ns, cpu, nullptr, one_ws.data(), detail::NormCheck::kBackend);
    }
  }
  // Counter(v, rate | invert) reports time / (v iterations): v = E / 1000 gives ms per matrix.
  // Counter(v, rate | invert) reports time / (v iterations): the time per matrix.
  state.counters["per_matrix"] =
      benchmark::Counter(static_cast<double>(count), benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}

}  // namespace

BENCHMARK(BM_experts)
    ->ArgNames({"E", "m", "n", "batched", "scattered"})
    ->Args({64, 256, 512, 0, 0})
    ->Args({64, 256, 512, 1, 0})
    ->Args({64, 256, 512, 1, 1})
    ->Args({64, 64, 128, 0, 0})
    ->Args({64, 64, 128, 1, 0})
    ->Args({64, 64, 128, 1, 1})
    ->Args({8, 128, 64, 0, 0})
    ->Args({8, 128, 64, 1, 0})
    ->Args({8, 128, 64, 1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_MAIN();
