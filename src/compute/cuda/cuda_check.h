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

}  // namespace distmuon::cuda
