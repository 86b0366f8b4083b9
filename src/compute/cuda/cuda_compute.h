#pragma once
// The CUDA compute backend (cuBLAS and the kernels of cuda_kernels.cu on device memory, one
// compute stream per backend, its NCCL collectives on a communication stream beside it ordered
// by events: cuda_nccl_device.h). Built with DISTMUON_ENABLE_CUDA; docs/gpu.md describes it.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "compute/cuda/ns_graph_cache.h"
#include "distmuon/compute.h"

namespace distmuon {

// The precision of gemm and syrk is each call's (Compute::gemm's Precision, precision.h):
// fp32 runs CUBLAS_COMPUTE_32F (syrk: cublasSsyrk), tf32 CUBLAS_COMPUTE_32F_FAST_TF32, bf16
// cuBLAS's native bf16 GEMM on bf16 copies of the operands (rounded by a kernel into scratch the
// backend keeps), fp32 accumulation and output. Elementwise operations and reductions are fp32
// (reductions in double where Compute asks for it) at every precision.
//
// DISTMUON_CUDA_PRECISION (fp32, tf32 or bf16; unset or empty: none) is an override for
// experiments: when set, the process-wide backend runs every product at that precision whatever
// the caller asked. Throws distmuon::Error on an unknown value.
std::optional<Precision> cuda_precision_override();

// The number of CUDA devices (0 when there is none or no driver).
int cuda_device_count();
// A new CUDA backend on the current device with its own stream, cuBLAS handle and statistics.
// With `override`, every product runs at that precision whatever the caller asks (as
// DISTMUON_CUDA_PRECISION does for the process-wide backend). Throws distmuon::Error when there is
// no CUDA device.
std::unique_ptr<Compute> make_cuda_compute(std::optional<Precision> override = std::nullopt);
// A new CUDA backend of `device` on `stream`, a stream the caller owns and keeps alive (the
// legacy default stream 0 included): everything the backend does (kernels, cuBLAS, its
// stream-ordered allocations, NCCL) is queued on it, ordered with the caller's own work there.
// Throws distmuon::Error when device is not a CUDA device of this process.
std::unique_ptr<Compute> make_cuda_compute_on_stream(
    int device, cudaStream_t stream, std::optional<Precision> override = std::nullopt);
// The process-wide one per (device, stream), with cuda_precision_override() (compute.h's
// cuda_compute_on_stream: the Python bindings' backend for PyTorch's current stream).
Compute& cuda_compute_on_stream(int device, std::uintptr_t stream);
// The process-wide CUDA backend of the current device, with cuda_precision_override() (compute.h's
// compute_backend("cuda")). Throws distmuon::Error when there is no CUDA device.
Compute& cuda_compute();
// The stream all of a CUDA backend's work is queued on (compute must be a CUDA backend).
cudaStream_t cuda_stream(Compute& compute);
// The CUDA graphs of a CUDA backend's newton_schulz_bf16 (DISTMUON_CUDA_GRAPHS=1, read when the
// backend is made; docs/gpu.md "CUDA graphs"): how often they were captured, replayed and
// evicted. compute must be a CUDA backend.
cuda::GraphStats cuda_graph_stats(Compute& compute);
// Turns a CUDA backend's graph capture on or off (tests: the uncaptured path of a backend that
// has the graphs' cuBLAS workspace). Turning it on gives cuBLAS the workspace first when the
// backend has none yet. compute must be a CUDA backend.
void set_cuda_graphs(Compute& compute, bool on);
// compute_backend("cuda"): makes this rank's GPU current, then cuda_compute(). The GPU is
// DISTMUON_CUDA_DEVICE when set, else the node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, ...)
// modulo the node's device count: one GPU per rank under mpirun. Throws without a device.
Compute& cuda_compute_of_this_rank();

}  // namespace distmuon
