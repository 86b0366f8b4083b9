// CUDA events as the intervals of a StreamTimer (cuda_stream_timer.h).
#include "compute/cuda/cuda_stream_timer.h"

#include <fmt/format.h>

#include <utility>
#include <vector>

#include "compute/cuda/cuda_check.h"

namespace distmuon {
namespace {

using cuda::check;

// Intervals between pairs of CUDA events recorded on the backend's stream; the events are made
// once and reused, so a steady-state step creates none.
class CudaStreamTimer final : public StreamTimer {
 public:
  CudaStreamTimer(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaStreamTimer() override {
    cudaSetDevice(device_);  // errors ignored: at process exit the runtime may be gone
    for (auto& [a, b] : events_) {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
  CudaStreamTimer(const CudaStreamTimer&) = delete;
  CudaStreamTimer& operator=(const CudaStreamTimer&) = delete;

  void start() override {
    cuda::make_current(device_, "stream timer");
    if (used_ == events_.size()) {
      std::pair<cudaEvent_t, cudaEvent_t> pair{nullptr, nullptr};
      check(cudaEventCreate(&pair.first), "cudaEventCreate", "stream timer");
      if (const auto rc = cudaEventCreate(&pair.second); rc != cudaSuccess) {
        cudaEventDestroy(pair.first);
        check(rc, "cudaEventCreate", "stream timer");
      }
      events_.push_back(pair);
    }
    check(cudaEventRecord(events_[used_].first, stream_), "cudaEventRecord", "interval start");
    open_ = true;
  }
  void stop() override {
    if (!open_) return;  // start() failed
    cuda::make_current(device_, "stream timer");
    check(cudaEventRecord(events_[used_].second, stream_), "cudaEventRecord", "interval end");
    open_ = false;
    ++used_;
  }
  double seconds() override {
    const std::size_t n = std::exchange(used_, 0);
    open_ = false;
    if (n == 0) return 0.0;
    cuda::make_current(device_, "stream timer");
    check(cudaEventSynchronize(events_[n - 1].second), "cudaEventSynchronize",
          fmt::format("the last of {} timed intervals", n));
    double ms = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      float interval = 0.0f;
      check(cudaEventElapsedTime(&interval, events_[i].first, events_[i].second),
            "cudaEventElapsedTime", fmt::format("interval {} of {}", i, n));
      ms += interval;
    }
    return ms * 1e-3;
  }
  void clear() noexcept override {
    used_ = 0;
    open_ = false;
  }

 private:
  int device_;
  cudaStream_t stream_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
  std::size_t used_ = 0;  // complete intervals marked since the last seconds() or clear()
  bool open_ = false;     // start() recorded events_[used_].first
};

}  // namespace

std::unique_ptr<StreamTimer> make_cuda_stream_timer(int device, cudaStream_t stream) {
  return std::make_unique<CudaStreamTimer>(device, stream);
}

}  // namespace distmuon
