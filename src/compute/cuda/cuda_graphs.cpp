// CUDA graphs of the bf16-storage Newton-Schulz (cuda_graphs.h).
#include "compute/cuda/cuda_graphs.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string_view>

#include "compute/cuda/cuda_check.h"
#include "distmuon/error.h"

namespace distmuon::cuda {

bool cuda_graphs_option() {
  const char* env = std::getenv("DISTMUON_CUDA_GRAPHS");
  if (env == nullptr || *env == '\0' || std::string_view(env) == "0") return false;
  if (std::string_view(env) == "1") return true;
  throw Error(fmt::format("DISTMUON_CUDA_GRAPHS: '{}' is not 0 or 1", env));
}

std::size_t graph_blas_workspace_bytes(int compute_major) {
  return (compute_major >= 9 ? std::size_t{32} : std::size_t{4}) << 20;
}

NsGraphs::NsGraphs()
    : cache_(kCapacity, [](cudaGraphExec_t& g) {
        check(cudaGraphExecDestroy(g), "cudaGraphExecDestroy", "a least recently used NS graph");
      }) {}

GraphStats NsGraphs::stats() const {
  return {warmups_, captures_, replays_, cache_.evictions(), cache_.size()};
}

bool NsGraphs::run(cudaStream_t stream, const NsGraphKey& key, const std::function<void()>& work,
                   const char* what) {
  if (stream == nullptr || stream == cudaStreamLegacy) return false;  // not capturable
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing", what);
  if (status != cudaStreamCaptureStatusNone) return false;
  cudaGraphExec_t* slot = cache_.find(key);
  if (slot == nullptr) {
    // First sight of this key: the plain calls run once (a warm-up, as before any capture: the
    // kernels and cuBLAS's choices are loaded outside it); the second call captures.
    cache_.insert(key, nullptr);
    ++warmups_;
    return false;
  }
  if (*slot != nullptr) {
    check(cudaGraphLaunch(*slot, stream), "cudaGraphLaunch", what);
    ++replays_;
    return true;
  }
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture",
        what);
  // Ends the capture (whatever its state) and drops what it recorded; the stream is usable after.
  const auto abandon = [&] {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);
    if (partial != nullptr) cudaGraphDestroy(partial);
    cudaGetLastError();  // capture errors are not sticky: clear the one left by the abandon
  };
  try {
    work();
  } catch (const Error& e) {
    abandon();
    throw Error(fmt::format("{}: while capturing a CUDA graph (DISTMUON_CUDA_GRAPHS=1): {}", what,
                            e.what()));
  } catch (...) {
    abandon();
    throw;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    check(end, "cudaStreamEndCapture",
          fmt::format("{}: the capture was invalidated (DISTMUON_CUDA_GRAPHS=1; unset it to run "
                      "without graphs)",
                      what));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  const cudaError_t freed = cudaGraphDestroy(graph);  // the executable graph is a copy
  if (made != cudaSuccess && exec != nullptr) cudaGraphExecDestroy(exec);
  check(made, "cudaGraphInstantiate", what);
  if (freed != cudaSuccess) {
    cudaGraphExecDestroy(exec);
    check(freed, "cudaGraphDestroy", what);
  }
  *slot = exec;  // the cache's entry (std::list: stable while the capture ran)
  ++captures_;
  check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch", what);
  return true;
}

}  // namespace distmuon::cuda
