// cuBLAS opened at run time (cuda_libraries.h).
#include "compute/cuda/cuda_libraries.h"

#include <fmt/format.h>

#include "distmuon/error.h"

#ifndef DISTMUON_CUBLAS_DIR
#define DISTMUON_CUBLAS_DIR ""
#endif

namespace distmuon::cuda {
namespace {

// CublasApi::gemm_ex is spelled out (cublasGemmEx is overloaded in C++): this cast compiles only
// when it is exactly the type of one of the declared functions.
static_assert(sizeof(static_cast<decltype(CublasApi::gemm_ex)>(&::cublasGemmEx)) > 0);
static_assert(sizeof(static_cast<decltype(CublasApi::gemm_batched_ex)>(&::cublasGemmBatchedEx)) >
              0);
static_assert(sizeof(static_cast<decltype(CublasApi::gemm_strided_batched_ex)>(
                  &::cublasGemmStridedBatchedEx)) > 0);

CublasApi load_cublas() {
  const std::string soname = cublas_soname();
  void* lib = open_library(soname, DISTMUON_CUBLAS_DIR, "install cuBLAS or set LD_LIBRARY_PATH");
  CublasApi api{};
  resolve(api.create, lib, soname, "cublasCreate_v2");
  resolve(api.destroy, lib, soname, "cublasDestroy_v2");
  resolve(api.set_stream, lib, soname, "cublasSetStream_v2");
  resolve(api.set_workspace, lib, soname, "cublasSetWorkspace_v2");
  resolve(api.ssyrk, lib, soname, "cublasSsyrk_v2");
  resolve(api.gemm_ex, lib, soname, "cublasGemmEx");
  resolve(api.gemm_batched_ex, lib, soname, "cublasGemmBatchedEx");
  resolve(api.gemm_strided_batched_ex, lib, soname, "cublasGemmStridedBatchedEx");
  resolve(api.get_status_string, lib, soname, "cublasGetStatusString");
  resolve(api.get_status_name, lib, soname, "cublasGetStatusName");
  return api;
}

}  // namespace

std::string cublas_soname() {
  return fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR);
}

const CublasApi& cublas() {
  // A function-local static: initialised once, thread-safe; a throwing load leaves it
  // uninitialised, so the next call tries again.
  static const CublasApi api = load_cublas();
  return api;
}

}  // namespace distmuon::cuda
