// Times distmuon's Newton-Schulz on the CUDA backend (standard and Gram; fp32, TF32, bf16) at
// 4096x4096, 4096x14336 and 8192x8192, and the GEMM rate of the same GPU (8192^3; bf16 operands
// with fp32 accumulation is "the bf16 GEMM rate"), in one run. With the JSON of
// bench/torch_newton_schulz.py it also prints PyTorch's time of the same algorithm and
// precision and the ratio (PyTorch time / distmuon time: above 1, distmuon is faster).
//
//   bench_cuda_ns [torch_ns.json] [--reps N] [--json out.json]
//
// TFLOP/s count the plain GEMM work of each algorithm (ns_flops with use_syrk = false: every
// symmetric product counted as a full GEMM), the same count for distmuon and PyTorch. Times
// are medians over the repetitions, measured with CUDA events on the backend's stream.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "compute/cuda/cuda_check.h"
#include "compute/cuda/cuda_compute.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"

namespace distmuon {
namespace {

using cuda::check;

struct Shape {
  Index m, n;
};
constexpr Shape kShapes[] = {{4096, 4096}, {4096, 14336}, {8192, 8192}};
constexpr Precision kPrecisions[] = {Precision::kFp32, Precision::kTf32, Precision::kBf16};
// PyTorch's precision of the same arithmetic.
std::string torch_precision(Precision p) {
  return to_string(p);
}
constexpr NsAlgorithm kAlgorithms[] = {NsAlgorithm::kStandard, NsAlgorithm::kGram};

// Median milliseconds of `reps` calls of fn on stream (after `warmup` calls).
double median_ms(cudaStream_t stream, int warmup, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i)
    fn();
  cudaEvent_t start = nullptr, end = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate", "bench");
  check(cudaEventCreate(&end), "cudaEventCreate", "bench");
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord", "bench");
    fn();
    check(cudaEventRecord(end, stream), "cudaEventRecord", "bench");
    check(cudaEventSynchronize(end), "cudaEventSynchronize", "bench");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, end), "cudaEventElapsedTime", "bench");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Uniform [-1, 1) entries from a fixed seed (fast for 64M elements).
Matrix random_host(Index rows, Index cols, std::uint64_t seed) {
  Matrix m(rows, cols);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (Index i = 0; i < rows; ++i) {
    for (Index j = 0; j < cols; ++j) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      m(i, j) = static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
    }
  }
  return m;
}

// TFLOP/s of cublasGemmEx at n^3 with the given operand type and compute type.
double gemm_tflops(cudaStream_t stream, Index n, cudaDataType_t type, cublasComputeType_t ct,
                   int reps) {
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h), "cublasCreate", "bench");
  check(cublasSetStream(h, stream), "cublasSetStream", "bench");
  const std::size_t elem = type == CUDA_R_16BF ? 2 : 4;
  const auto bytes = static_cast<std::size_t>(n * n) * elem;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc", "gemm bench");
  check(cudaMalloc(&b, bytes), "cudaMalloc", "gemm bench");
  check(cudaMalloc(&c, bytes), "cudaMalloc", "gemm bench");
  check(cudaMemsetAsync(a, 0x3c, bytes, stream), "cudaMemset", "gemm bench");  // finite values
  check(cudaMemsetAsync(b, 0x3c, bytes, stream), "cudaMemset", "gemm bench");
  const float alpha = 1.0f, beta = 0.0f;
  const int ni = static_cast<int>(n);
  const double ms = median_ms(stream, 2, reps, [&] {
    check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, a, type, ni, b, type, ni,
                       &beta, c, type, ni, ct, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx", "gemm bench");
  });
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cublasDestroy(h);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) /
         (ms * 1e-3) / 1e12;
}

int run(int argc, char** argv) {
  std::string torch_file, json_out;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::stoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json_out = argv[++i];
    } else if (!a.empty() && a[0] != '-') {
      torch_file = a;
    } else {
      std::fprintf(stderr, "usage: bench_cuda_ns [torch_ns.json] [--reps N] [--json out.json]\n");
      return 2;
    }
  }
  // PyTorch's times by (algorithm, precision, m, n).
  std::map<std::tuple<std::string, std::string, Index, Index>, double> torch_ms;
  if (!torch_file.empty()) {
    std::ifstream in(torch_file);
    if (!in) throw Error(fmt::format("cannot read {}", torch_file));
    const auto j = nlohmann::json::parse(in);
    for (const auto& r : j.at("results")) {
      torch_ms[{r.at("algorithm").get<std::string>(), r.at("precision").get<std::string>(),
                r.at("m").get<Index>(), r.at("n").get<Index>()}] = r.at("ms").get<double>();
    }
  }

  if (cuda_device_count() == 0) throw Error("no CUDA device");
  cudaDeviceProp prop{};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice", "bench");
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", "bench");
  fmt::print("device {}: {} (sm_{}{}), {} SMs\n", device, prop.name, prop.major, prop.minor,
             prop.multiProcessorCount);

  nlohmann::json out;
  out["device"] = prop.name;
  // The GEMM rates of this GPU, 8192^3, measured in this run.
  auto stream_owner = make_cuda_compute();
  const cudaStream_t gemm_stream = cuda_stream(*stream_owner);
  const Index g = 8192;
  const double bf16_rate =
      gemm_tflops(gemm_stream, g, CUDA_R_16BF, CUBLAS_COMPUTE_32F, std::max(reps, 5));
  const double bf16_fast_rate =
      gemm_tflops(gemm_stream, g, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF, std::max(reps, 5));
  const double tf32_rate =
      gemm_tflops(gemm_stream, g, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, std::max(reps, 5));
  const double fp32_rate = gemm_tflops(gemm_stream, g, CUDA_R_32F, CUBLAS_COMPUTE_32F, reps);
  fmt::print(
      "GEMM 8192^3: bf16 operands {:.1f} TFLOP/s, fp32 operands with bf16 compute "
      "(distmuon's bf16) {:.1f}, tf32 {:.1f}, fp32 {:.1f}\n",
      bf16_rate, bf16_fast_rate, tf32_rate, fp32_rate);
  out["gemm_tflops"] = {{"bf16", bf16_rate},
                        {"fp32_fast_bf16", bf16_fast_rate},
                        {"tf32", tf32_rate},
                        {"fp32", fp32_rate}};

  fmt::print("\n{:<9} {:<13} {:>11} {:>11} {:>9} {:>11} {:>9} {:>14}\n", "algorithm", "precision",
             "shape", "distmuon ms", "TFLOP/s", "torch ms", "torch/dm", "of bf16 GEMM");
  for (const Shape& sh : kShapes) {
    const Matrix host = random_host(sh.m, sh.n, 7);
    for (const Precision p : kPrecisions) {
      auto compute = make_cuda_compute();
      const cudaStream_t stream = cuda_stream(*compute);
      for (const NsAlgorithm algorithm : kAlgorithms) {
        NsOptions opts;  // distmuon's defaults: quintic, 5 steps, syrk
        opts.algorithm = algorithm;
        opts.precision = p;  // each call's precision
        DeviceMatrix x = to_device(*compute, host.view());
        NsWorkspace ws;
        const double ms = median_ms(stream, 2, reps, [&] {
          newton_schulz_inplace(x.view(), opts, *compute, nullptr, &ws);
        });
        NsOptions plain = opts;
        plain.use_syrk = false;
        const double tflops = ns_flops(sh.m, sh.n, plain) / (ms * 1e-3) / 1e12;
        const auto key =
            std::tuple{std::string(to_string(algorithm)), torch_precision(p), sh.m, sh.n};
        const auto t = torch_ms.find(key);
        const std::string shape = fmt::format("{}x{}", sh.m, sh.n);
        const std::string torch_col = t == torch_ms.end() ? "-" : fmt::format("{:.2f}", t->second);
        const std::string ratio = t == torch_ms.end() ? "-" : fmt::format("{:.2f}", t->second / ms);
        const std::string of_gemm = fmt::format("{:.0f}%", 100.0 * tflops / bf16_rate);
        fmt::print("{:<9} {:<13} {:>11} {:>11.2f} {:>9.1f} {:>11} {:>9} {:>14}\n",
                   to_string(algorithm), to_string(p), shape, ms, tflops, torch_col, ratio,
                   of_gemm);
        out["results"].push_back(
            {{"algorithm", to_string(algorithm)},
             {"precision", to_string(p)},
             {"m", sh.m},
             {"n", sh.n},
             {"ms", ms},
             {"tflops", tflops},
             {"torch_ms", t == torch_ms.end() ? nlohmann::json() : nlohmann::json(t->second)},
             {"fraction_of_bf16_gemm", tflops / bf16_rate}});
      }
    }
  }
  fmt::print(
      "\ntorch/dm: PyTorch's time over distmuon's (above 1: distmuon faster). "
      "of bf16 GEMM: TFLOP/s over the bf16 GEMM rate above (the target: standard, bf16, "
      "8192x8192 at 70% or more).\n");
  if (!json_out.empty()) std::ofstream(json_out) << out.dump(1) << "\n";
  return 0;
}

}  // namespace
}  // namespace distmuon

int main(int argc, char** argv) {
  try {
    return distmuon::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_ns: %s\n", e.what());
    return 1;
  }
}
