// Times distmuon's Newton-Schulz on the CUDA backend (standard and Gram; fp32 and bf16 with syrk
// on and off, TF32) at 1024x1024, 2048x2048, 4096x4096, 4096x14336 and 8192x8192, and the GEMM
// rates of the same GPU (8192^3 on random data: fp32, TF32, and bf16 operands with fp32
// accumulation), in one run.
// scripts/device-check.sh runs it first, then PyTorch's NS (bench/torch_newton_schulz.py), and
// puts the two side by side (bench/device_summary.py).
//
//   bench_cuda_ns [--reps N] [--json out.json]
//
// TFLOP/s count the plain GEMM work of each algorithm (ns_flops with use_syrk = false: every
// symmetric product counted as a full GEMM), the count PyTorch's NS is given too; "of GEMM" is
// that rate over the GEMM rate of the same precision. Times are medians over the repetitions,
// measured with CUDA events on the backend's stream.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
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
constexpr Shape kShapes[] = {{1024, 1024}, {2048, 2048}, {4096, 4096}, {4096, 14336}, {8192, 8192}};
// What is timed: each precision of the products, fp32 with syrk on and off.
struct Variant {
  Precision precision;  // the products' precision (and the GEMM rate it is compared with)
  bool syrk;
};
constexpr Variant kVariants[] = {{Precision::kFp32, true},
                                 {Precision::kFp32, false},
                                 {Precision::kTf32, true},
                                 {Precision::kBf16, true},
                                 {Precision::kBf16, false}};
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

// n x n random entries (random_host) into device memory of `type` (fp32, or bf16 rounded to
// nearest even).
void upload_random(void* dst, Index n, cudaDataType_t type, std::uint64_t seed) {
  const Matrix host = random_host(n, n, seed);
  const auto count = static_cast<std::size_t>(n * n);
  if (type != CUDA_R_16BF) {
    check(cudaMemcpy(dst, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy",
          "gemm bench operands");
    return;
  }
  std::vector<std::uint16_t> bf16(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, host.data() + i, sizeof bits);
    bf16[i] = static_cast<std::uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
  check(cudaMemcpy(dst, bf16.data(), count * 2, cudaMemcpyHostToDevice), "cudaMemcpy",
        "gemm bench operands");
}

// TFLOP/s of cublasGemmEx at n^3 with the given operand type and compute type.
double gemm_tflops(cudaStream_t stream, Index n, cudaDataType_t type, cublasComputeType_t ct,
                   int reps, cudaDataType_t c_type) {
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h), "cublasCreate", "bench");
  check(cublasSetStream(h, stream), "cublasSetStream", "bench");
  const std::size_t elem = type == CUDA_R_16BF ? 2 : 4;
  const auto bytes = static_cast<std::size_t>(n * n) * elem;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc", "gemm bench");
  check(cudaMalloc(&b, bytes), "cudaMalloc", "gemm bench");
  check(cudaMalloc(&c, static_cast<std::size_t>(n * n) * 4), "cudaMalloc", "gemm bench");
  // Random operands: constant or zero data runs measurably faster than real data.
  upload_random(a, n, type, 11);
  upload_random(b, n, type, 12);
  const float alpha = 1.0f, beta = 0.0f;
  const int ni = static_cast<int>(n);
  const double ms = median_ms(stream, 2, reps, [&] {
    check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, a, type, ni, b, type, ni,
                       &beta, c, c_type, ni, ct, CUBLAS_GEMM_DEFAULT),
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
  std::string json_out;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::stoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json_out = argv[++i];
    } else {
      std::fprintf(a == "--help" ? stdout : stderr,
                   "usage: bench_cuda_ns [--reps N] [--json out.json]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (reps < 1) throw Error(fmt::format("--reps {}: must be >= 1", reps));
  if (cuda_device_count() == 0) throw Error("no CUDA device");
  cudaDeviceProp prop{};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice", "bench");
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", "bench");
  fmt::print("device {}: {} (sm_{}{}), {} SMs\n", device, prop.name, prop.major, prop.minor,
             prop.multiProcessorCount);

  nlohmann::json out;
  out["device"] = prop.name;
  // The GEMM rates of this GPU, 8192^3 on random data, measured in this run.
  auto stream_owner = make_cuda_compute();
  const cudaStream_t gemm_stream = cuda_stream(*stream_owner);
  const Index g = 8192;
  const int gemm_reps = std::max(reps, 5);
  std::map<std::string, double> rate;
  rate["bf16"] =
      gemm_tflops(gemm_stream, g, CUDA_R_16BF, CUBLAS_COMPUTE_32F, gemm_reps, CUDA_R_16BF);
  rate["tf32"] =
      gemm_tflops(gemm_stream, g, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, gemm_reps, CUDA_R_32F);
  rate["fp32"] = gemm_tflops(gemm_stream, g, CUDA_R_32F, CUBLAS_COMPUTE_32F, reps, CUDA_R_32F);
  // distmuon's bf16 products: bf16 operands, fp32 result (not a reference rate, a diagnosis).
  const double bf16_fp32_out =
      gemm_tflops(gemm_stream, g, CUDA_R_16BF, CUBLAS_COMPUTE_32F, gemm_reps, CUDA_R_32F);
  fmt::print(
      "GEMM 8192^3 on random data: bf16 operands {:.1f} TFLOP/s (with an fp32 result {:.1f}), "
      "tf32 {:.1f}, fp32 {:.1f}\n",
      rate["bf16"], bf16_fp32_out, rate["tf32"], rate["fp32"]);
  out["gemm_bf16_fp32_result_tflops"] = bf16_fp32_out;
  out["gemm_tflops"] = rate;

  fmt::print("\n{:<9} {:<5} {:<4} {:>11} {:>11} {:>9} {:>8}\n", "algorithm", "prec", "syrk",
             "shape", "ms", "TFLOP/s", "of GEMM");
  for (const Shape& sh : kShapes) {
    const Matrix host = random_host(sh.m, sh.n, 7);
    for (const Variant& v : kVariants) {
      auto compute = make_cuda_compute();
      const cudaStream_t stream = cuda_stream(*compute);
      for (const NsAlgorithm algorithm : kAlgorithms) {
        if (algorithm == NsAlgorithm::kGram && !v.syrk) continue;  // Gram's products are GEMMs
        NsOptions opts;  // distmuon's defaults: quintic, 5 steps
        opts.algorithm = algorithm;
        opts.use_syrk = v.syrk;
        opts.precision = v.precision;  // each call's precision
        DeviceMatrix x = to_device(*compute, host.view());
        NsWorkspace ws;
        const double ms = median_ms(stream, 2, reps, [&] {
          newton_schulz_inplace(x.view(), opts, *compute, nullptr, &ws);
        });
        NsOptions plain = opts;
        plain.use_syrk = false;
        const double tflops = ns_flops(sh.m, sh.n, plain) / (ms * 1e-3) / 1e12;
        const double of_gemm = tflops / rate.at(to_string(v.precision));
        fmt::print("{:<9} {:<5} {:<4} {:>11} {:>11.2f} {:>9.1f} {:>7.0f}%\n", to_string(algorithm),
                   to_string(v.precision), v.syrk ? "on" : "off", fmt::format("{}x{}", sh.m, sh.n),
                   ms, tflops, 100.0 * of_gemm);
        out["results"].push_back({{"algorithm", to_string(algorithm)},
                                  {"precision", to_string(v.precision)},
                                  {"syrk", v.syrk},
                                  {"m", sh.m},
                                  {"n", sh.n},
                                  {"ms", ms},
                                  {"tflops", tflops},
                                  {"of_gemm", of_gemm}});
      }
    }
  }
  fmt::print(
      "\nof GEMM: the NS rate over the GEMM rate of the same precision (the target: standard, "
      "bf16, 8192x8192 at 70% or more of the bf16 rate).\n");
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
