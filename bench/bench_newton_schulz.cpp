// Single-process Newton-Schulz throughput against the sgemm rate measured in the same run.
//
// Counters per NS benchmark:
// Arguments: m, n, syrk (1) or gemm (0), the Gram algorithm (1) or the standard one (0).
//   gflops_plain   rate counted with the standard algorithm's plain-GEMM FLOPs,
//                  steps * (4 s^2 L + 2 s^3), whatever the algorithm (a time-to-result rate)
//   gflops_exec    rate counted with the FLOPs the path executes (syrk halves symmetric products)
//   sgemm_gflops   sgemm rate of this process, measured once at start-up on NS-sized products
//   bound_frac     bound / time, bound = executed FLOPs at the sgemm rate (1.0 = at the bound)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "distmuon/compute.h"
#include "distmuon/newton_schulz.h"

namespace {
using namespace distmuon;

Matrix gaussian(Index m, Index n, unsigned seed) {
  Matrix g(m, n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  for (float& v : g.values())
    v = d(rng);
  return g;
}

// Median sgemm rate (GFLOP/s) of C[s, L] = A[s, s] B[s, L], the update product of NS.
double measure_sgemm_gflops(Index s, Index l) {
  const Matrix a = gaussian(s, s, 1), b = gaussian(s, l, 2);
  Matrix c(s, l);
  Compute& cpu = cpu_compute();
  std::vector<double> rates;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu.gemm(Trans::kNo, Trans::kNo, 1.0f, a.view(), b.view(), 0.0f, c.view());
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) rates.push_back(2.0 * s * s * l / sec * 1e-9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

void BM_sgemm(benchmark::State& state) {
  const Index s = state.range(0), l = state.range(1);
  const Matrix a = gaussian(s, s, 1), b = gaussian(s, l, 2);
  Matrix c(s, l);
  for (auto _ : state) {
    cpu_compute().gemm(Trans::kNo, Trans::kNo, 1.0f, a.view(), b.view(), 0.0f, c.view());
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["gflops"] = benchmark::Counter(
      2.0 * s * s * l, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// The products of NS on 1024x4096 at fp32 (OpenBLAS sgemm / ssyrk) and bf16 (oneDNN's bf16
// kernels, the operands' bf16 copies included): arguments m, n, k of c[m, n] = a[m, k] b[k, n],
// syrk (1: c = a a^T of a[m, k], n = m) or gemm (0), precision (0 fp32, 2 bf16).
void BM_product(benchmark::State& state) {
  const Index m = state.range(0), n = state.range(1), k = state.range(2);
  const bool syrk = state.range(3) != 0;
  const Precision p = state.range(4) == 2 ? Precision::kBf16 : Precision::kFp32;
  const Matrix a = gaussian(m, k, 1), b = gaussian(k, n, 2);
  Matrix c(m, n);
  for (auto _ : state) {
    if (syrk) {
      cpu_compute().syrk(Trans::kNo, 1.0f, a.view(), 0.0f, c.view(), p);
    } else {
      cpu_compute().gemm(Trans::kNo, Trans::kNo, 1.0f, a.view(), b.view(), 0.0f, c.view(), p);
    }
    benchmark::DoNotOptimize(c.data());
  }
  // A syrk counted as the full product it replaces (a time-to-result rate).
  state.counters["gflops"] = benchmark::Counter(
      2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.SetLabel(fmt::format("{} {}", syrk ? "syrk" : "gemm", to_string(p)));
}

void BM_newton_schulz(benchmark::State& state) {
  const Index m = state.range(0), n = state.range(1);
  const bool syrk = state.range(2) != 0;
  static const double sgemm = measure_sgemm_gflops(1024, 4096);
  NsOptions o;
  o.use_syrk = syrk;
  o.algorithm = state.range(3) != 0 ? NsAlgorithm::kGram : NsAlgorithm::kStandard;
  const Matrix g = gaussian(m, n, 3);
  Matrix x(m, n);
  NsWorkspace ws;
  double seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    copy(g.view(), x.view());
    state.ResumeTiming();
    const auto t0 = std::chrono::steady_clock::now();
    newton_schulz_inplace(x.view(), o, cpu_compute(), nullptr, &ws);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double per_run = seconds / static_cast<double>(state.iterations());
  const double exec = ns_flops(m, n, o);
  state.counters["gflops_plain"] = ns_gemm_flops(m, n, o.steps) / per_run * 1e-9;
  state.counters["gflops_exec"] = exec / per_run * 1e-9;
  state.counters["sgemm_gflops"] = sgemm;
  state.counters["bound_frac"] = exec / (sgemm * 1e9) / per_run;
  state.SetLabel(fmt::format("{} {}", syrk ? "syrk" : "gemm", to_string(o.algorithm)));
}

}  // namespace

BENCHMARK(BM_sgemm)
    ->Args({1024, 4096})
    ->Args({2048, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_product)
    ->ArgNames({"m", "n", "k", "syrk", "precision"})
    ->ArgsProduct({{1024}, {1024}, {4096}, {1}, {0, 2}})  // the Gram matrix X X^T
    ->ArgsProduct({{1024}, {1024}, {1024}, {1}, {0, 2}})  // A A, A symmetric
    ->ArgsProduct({{1024}, {4096}, {1024}, {0}, {0, 2}})  // the update B X
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_newton_schulz)
    ->ArgNames({"m", "n", "syrk", "gram"})
    ->ArgsProduct({{1024}, {4096}, {0, 1}, {0, 1}})
    ->ArgsProduct({{4096}, {1024}, {0, 1}, {0, 1}})
    ->ArgsProduct({{2048}, {2048}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

BENCHMARK_MAIN();
