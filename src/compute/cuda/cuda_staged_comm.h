#pragma once
// A data plane for the CUDA backend without NCCL: every collective stages its device buffers
// through host memory and runs on the host communicator (MPI, gloo). For ranks that share one GPU
// (NCCL refuses two ranks on one device) and for machines without NCCL; slower than NCCL (two
// copies and a stream synchronisation per collective). Chosen by DISTMUON_CUDA_DATA_PLANE=host.
#include <cuda_runtime.h>

#include <memory>

#include "distmuon/comm.h"

namespace distmuon::cuda {

std::shared_ptr<CommImpl> make_staged_comm(std::shared_ptr<CommImpl> host, int device,
                                           cudaStream_t stream);

// DISTMUON_CUDA_DATA_PLANE: true for "host", false for unset, empty or "nccl"; throws
// distmuon::Error naming the variable on another value.
bool staged_data_plane();

}  // namespace distmuon::cuda
