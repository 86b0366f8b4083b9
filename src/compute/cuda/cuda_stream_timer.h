#pragma once
// The CUDA backend's stream timer (Compute::stream_timer): intervals between CUDA events.
#include <cuda_runtime.h>

#include <memory>

#include "distmuon/compute.h"

namespace distmuon {

// Intervals marked by pairs of CUDA events recorded on `stream` (of `device`), summed by
// seconds() after waiting for the last one. The events are made on first need and reused, so a
// steady-state step creates none. Every call makes `device` current first.
std::unique_ptr<StreamTimer> make_cuda_stream_timer(int device, cudaStream_t stream);

}  // namespace distmuon
