// The CUDA backend's options and device query (cuda_compute.h): the DISTMUON_CUDA_PRECISION
// override, the device count.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdlib>

#include "compute/cuda/cuda_compute.h"
#include "distmuon/error.h"

namespace distmuon {

std::optional<Precision> cuda_precision_override() {
  const char* env = std::getenv("DISTMUON_CUDA_PRECISION");
  if (env == nullptr || *env == '\0') return std::nullopt;
  try {
    return parse_precision(env);
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
