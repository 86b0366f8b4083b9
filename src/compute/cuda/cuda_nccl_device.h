#pragma once
// The CUDA backend's device for its NCCL communicators (comm/nccl/nccl_comm.h): a communication
// stream beside the backend's compute stream, ordered by events both ways.
#include <cuda_runtime.h>

#include <memory>

#include "comm/nccl/nccl_comm.h"

namespace distmuon::cuda {

// NCCL operations of `device` queue on a stream of their own (made on first use, non-blocking):
// each waits for an event recorded on `compute` (the work queued before it), and `compute` waits
// for an event recorded after it, so that results are ordered as on one stream. A started
// operation (start_all_to_all_v) records an event of its own after it instead, and `compute` waits
// for that one only when the request is waited (NcclDevice::Completion::join): the compute
// stream's work queued in between (another chunk's NS) overlaps the exchange.
std::shared_ptr<NcclDevice> make_cuda_nccl_device(int device, cudaStream_t compute);

}  // namespace distmuon::cuda
