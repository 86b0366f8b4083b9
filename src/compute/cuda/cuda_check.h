#pragma once
// Checks of CUDA runtime and cuBLAS calls: a failure throws distmuon::Error naming the call, the
// library's error string and the caller's context (operation and shapes).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <string_view>

#include "compute/cuda/cuda_libraries.h"
#include "distmuon/error.h"

namespace distmuon::cuda {

inline void check(cudaError_t rc, std::string_view call, std::string_view context) {
  if (rc != cudaSuccess) {
    throw Error(fmt::format("cuda: {} failed: {} ({}) [{}]", call, cudaGetErrorString(rc),
                            cudaGetErrorName(rc), context));
  }
}

inline void check(cublasStatus_t rc, std::string_view call, std::string_view context) {
  if (rc != CUBLAS_STATUS_SUCCESS) {
    throw Error(fmt::format("cuda: {} failed: {} ({}) [{}]", call, cublas().get_status_string(rc),
                            cublas().get_status_name(rc), context));
  }
}

// Makes `device` the calling thread's current device (nothing when it already is): a backend
// and its communicator may be called from any thread, and CUDA's current device is per thread.
inline void make_current(int device, std::string_view context) {
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice", context);
  if (current != device) {
    check(cudaSetDevice(device), "cudaSetDevice", fmt::format("device {}: {}", device, context));
  }
}

}  // namespace distmuon::cuda
