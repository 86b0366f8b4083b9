#pragma once
// The CUDA compute backend (cuBLAS and the kernels of cuda_kernels.cu on device memory, one
// stream per backend). Built with DISTMUON_ENABLE_CUDA; docs/gpu.md describes it.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string_view>

#include "distmuon/compute.h"

namespace distmuon {

// The arithmetic of gemm and syrk. Elementwise operations and reductions are fp32 (reductions
// in double where Compute asks for it) in every mode.
enum class CudaPrecision {
  kFp32,  // IEEE fp32 (CUBLAS_COMPUTE_32F): the default
  kTf32,  // TF32 tensor cores, fp32 accumulation (CUBLAS_COMPUTE_32F_FAST_TF32)
  kBf16,  // bf16 tensor cores, fp32 accumulation, fp32 in memory (CUBLAS_COMPUTE_32F_FAST_16BF)
  // The same arithmetic on bf16 copies of the operands (rounded by a kernel before each
  // product, into scratch the backend keeps), so that cuBLAS runs its native bf16 GEMM.
  kBf16Operands,
};
// "fp32", "tf32", "bf16", "bf16-operands"; throws distmuon::Error listing them.
CudaPrecision parse_cuda_precision(std::string_view name);
const char* to_string(CudaPrecision precision);
// DISTMUON_CUDA_PRECISION (fp32 when unset); throws on an unknown value.
CudaPrecision cuda_precision_from_env();

// The number of CUDA devices (0 when there is none or no driver).
int cuda_device_count();
// A new CUDA backend on the current device with its own stream, cuBLAS handle and statistics.
// Throws distmuon::Error when there is no CUDA device.
std::unique_ptr<Compute> make_cuda_compute(CudaPrecision precision = CudaPrecision::kFp32);
// A new CUDA backend of `device` on `stream`, a stream the caller owns and keeps alive (the
// legacy default stream 0 included): everything the backend does (kernels, cuBLAS, its
// stream-ordered allocations, NCCL) is queued on it, ordered with the caller's own work there.
// Throws distmuon::Error when device is not a CUDA device of this process.
std::unique_ptr<Compute> make_cuda_compute_on_stream(int device, cudaStream_t stream,
                                                     CudaPrecision precision);
// The process-wide one per (device, stream), at cuda_precision_from_env() (compute.h's
// cuda_compute_on_stream: the Python bindings' backend for PyTorch's current stream).
Compute& cuda_compute_on_stream(int device, std::uintptr_t stream);
// The process-wide CUDA backend of the current device, at cuda_precision_from_env() (compute.h's
// compute_backend("cuda")). Throws distmuon::Error when there is no CUDA device.
Compute& cuda_compute();
// The stream all of a CUDA backend's work is queued on (compute must be a CUDA backend).
cudaStream_t cuda_stream(Compute& compute);
// compute_backend("cuda"): makes this rank's GPU current, then cuda_compute(). The GPU is
// DISTMUON_CUDA_DEVICE when set, else the node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, ...)
// modulo the node's device count: one GPU per rank under mpirun. Throws without a device.
Compute& cuda_compute_of_this_rank();

}  // namespace distmuon
