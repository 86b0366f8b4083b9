#pragma once
// The NCCL communicator: the data plane of the CUDA backend (Compute::data_communicator).
#include <cuda_runtime.h>

#include <memory>

#include "distmuon/comm.h"

namespace distmuon {

// An NCCL communicator over the ranks of `host`, for device memory on `device`, queueing every
// operation on `stream` (the CUDA backend's). Making it is rank-local; its first collective
// connects it, collectively over host's ranks: every rank loads NCCL (agreed over host), rank 0
// makes the unique id and broadcasts it over host (MPI), then every rank makes its device current
// and calls ncclCommInitRank, each step's failure on any rank agreed over host (CollectiveError
// on every rank).
// barrier and split go through host (split makes a new NCCL communicator over the host split).
// Errors throw distmuon::Error on the rank that sees them; NCCL reports some failures only after
// the operation was queued, and those are not agreed between ranks (docs/gpu.md).
std::shared_ptr<CommImpl> make_nccl_comm(std::shared_ptr<CommImpl> host, cudaStream_t stream,
                                         int device);

}  // namespace distmuon
