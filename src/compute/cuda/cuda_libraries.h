#pragma once
// cuBLAS loaded at run time (with the helpers of core/dynamic_library.h, which NCCL's loader in
// src/comm/nccl/nccl_comm.cpp uses too). libdistmuon links only the static CUDA runtime, which
// opens the driver when first used, so a program that never uses the cuda backend maps none of the
// GPU libraries. The first use of the cuda backend opens libcublas.so.<major of the headers> with
// dlopen and resolves the functions distmuon calls into a table of typed pointers (their types come
// from cublas_v2.h).
#include <cublas_v2.h>

#include <string>

#include "core/dynamic_library.h"

namespace distmuon::cuda {

// The cuBLAS functions distmuon calls (the _v2 names behind cublas_v2.h's macros).
struct CublasApi {
  decltype(&::cublasCreate_v2) create;
  decltype(&::cublasDestroy_v2) destroy;
  decltype(&::cublasSetStream_v2) set_stream;
  decltype(&::cublasSetWorkspace_v2) set_workspace;
  decltype(&::cublasSsyrk_v2) ssyrk;
  // cublas_api.h overloads cublasGemmEx in C++ (an inline wrapper taking a cudaDataType compute
  // type): this is the library's function, with a cublasComputeType_t.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  // cublasGemmBatchedEx, spelled out for the same reason.
  cublasStatus_t (*gemm_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void* const[], cudaDataType, int,
                                    const void* const[], cudaDataType, int, const void*,
                                    void* const[], cudaDataType, int, int, cublasComputeType_t,
                                    cublasGemmAlgo_t);
  // cublasGemmStridedBatchedEx, spelled out for the same reason.
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int, int, int, const void*, const void*, cudaDataType,
                                            int, long long int, const void*, cudaDataType, int,
                                            long long int, const void*, void*, cudaDataType, int,
                                            long long int, int, cublasComputeType_t,
                                            cublasGemmAlgo_t);
  decltype(&::cublasGetStatusString) get_status_string;
  decltype(&::cublasGetStatusName) get_status_name;
};

// The soname opened: libcublas.so.<CUBLAS_VER_MAJOR>.
std::string cublas_soname();
// cuBLAS, loaded on the first call (thread-safe; a failed load throws and the next call tries
// again).
const CublasApi& cublas();

}  // namespace distmuon::cuda
