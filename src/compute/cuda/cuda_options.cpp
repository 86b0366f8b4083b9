// The CUDA backend's options and device query (cuda_compute.h): precision names and
// DISTMUON_CUDA_PRECISION, the device count.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdlib>

#include "compute/cuda/cuda_compute.h"
#include "distmuon/error.h"

namespace distmuon {

CudaPrecision parse_cuda_precision(std::string_view name) {
  if (name == "fp32") return CudaPrecision::kFp32;
  if (name == "tf32") return CudaPrecision::kTf32;
  if (name == "bf16") return CudaPrecision::kBf16;
  if (name == "bf16-operands") return CudaPrecision::kBf16Operands;
  throw Error(
      fmt::format("unknown CUDA precision '{}'; valid: fp32, tf32, bf16, bf16-operands", name));
}

const char* to_string(CudaPrecision precision) {
  switch (precision) {
    case CudaPrecision::kFp32:
      return "fp32";
    case CudaPrecision::kTf32:
      return "tf32";
    case CudaPrecision::kBf16:
      return "bf16";
    case CudaPrecision::kBf16Operands:
      return "bf16-operands";
  }
  return "?";
}

CudaPrecision cuda_precision_from_env() {
  const char* env = std::getenv("DISTMUON_CUDA_PRECISION");
  if (env == nullptr || *env == '\0') return CudaPrecision::kFp32;
  try {
    return parse_cuda_precision(env);
  } catch (const Error& e) {
    throw Error(fmt::format("DISTMUON_CUDA_PRECISION: {}", e.what()));
  }
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" / "no driver" error
    return 0;
  }
  return n;
}

}  // namespace distmuon
