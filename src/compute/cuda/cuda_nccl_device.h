#pragma once
// The CUDA backend's device for its NCCL communicators (comm/nccl/nccl_comm.h): a communication
// stream beside the backend's compute stream, ordered by events both ways.
#include <cuda_runtime.h>

#include <memory>

#include "comm/nccl/nccl_comm.h"

namespace distmuon::cuda {

// NCCL operations of `device` queue on a stream of their own (made on first use, non-blocking):
// each waits for an event recorded on `compute` (the work queued before it), and `compute` waits
// for an event recorded after it, so that results are ordered as on one stream while a later
// overlap (the compute stream's work not depending on a collective) stays possible.
std::shared_ptr<NcclDevice> make_cuda_nccl_device(int device, cudaStream_t compute);

}  // namespace distmuon::cuda
