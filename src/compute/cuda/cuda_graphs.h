#pragma once
// CUDA graphs of the CUDA backend's bf16-storage Newton-Schulz (DISTMUON_CUDA_GRAPHS=1,
// docs/gpu.md "CUDA graphs"): each newton_schulz_bf16 call's work is captured once per key
// (ns_graph_cache.h) and replayed with one cudaGraphLaunch afterwards.
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>

#include "compute/cuda/ns_graph_cache.h"

namespace distmuon::cuda {

// DISTMUON_CUDA_GRAPHS: "1" on; unset, empty or "0" off. Throws distmuon::Error on another value.
bool cuda_graphs_option();

// The cuBLAS workspace a handle that runs in captured graphs is given (cublasSetWorkspace:
// NVIDIA's recommendation, 32 MiB on Hopper and later, 4 MiB before) for a device of this
// compute capability major.
std::size_t graph_blas_workspace_bytes(int compute_major);

// One backend's graphs: at most kCapacity keys (captured or seen once), least recently used
// destroyed first, all destroyed with it (the caller makes its device current first and its stream
// idle).
class NsGraphs {
 public:
  static constexpr std::size_t kCapacity = 64;
  NsGraphs();
  NsGraphs(const NsGraphs&) = delete;
  NsGraphs& operator=(const NsGraphs&) = delete;

  // Queues `work` (calls that queue onto `stream` and nothing else: no host wait, allocation or
  // read-back) on `stream` as the graph of `key`: replayed when captured before; captured
  // (cudaStreamBeginCapture, thread-local mode) and launched at the key's second call. Returns
  // false, having queued nothing, where the caller runs `work` itself, uncaptured: the key's
  // first call (a warm-up, remembered in the cache), the legacy default stream (it cannot be
  // captured), a stream already being captured (the caller's own graph then records the plain
  // calls). A failed capture throws distmuon::Error naming `what`, the capture ended first so
  // that the stream stays usable.
  bool run(cudaStream_t stream, const NsGraphKey& key, const std::function<void()>& work,
           const char* what);
  GraphStats stats() const;
  void clear() noexcept { cache_.clear(); }

 private:
  LruCache<NsGraphKey, cudaGraphExec_t> cache_;
  std::size_t warmups_ = 0, captures_ = 0, replays_ = 0;
};

}  // namespace distmuon::cuda
