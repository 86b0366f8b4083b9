// The CUDA backend's NCCL device (cuda_nccl_device.h).
#include "compute/cuda/cuda_nccl_device.h"

#include <fmt/format.h>

#include <mutex>
#include <vector>

#include "compute/cuda/cuda_check.h"
#include "distmuon/error.h"

namespace distmuon::cuda {
namespace {

class CudaNcclDevice final : public NcclDevice {
 public:
  CudaNcclDevice(int device, cudaStream_t compute) : device_(device), compute_(compute) {}
  ~CudaNcclDevice() override {
    // Errors ignored: at process exit the CUDA runtime may be gone.
    if (comm_ == nullptr) return;
    cudaSetDevice(device_);
    cudaStreamSynchronize(comm_);
    cudaEventDestroy(before_);
    cudaEventDestroy(after_);
    for (cudaEvent_t e : started_)
      cudaEventDestroy(e);
    cudaStreamDestroy(comm_);
  }
  CudaNcclDevice(const CudaNcclDevice&) = delete;
  CudaNcclDevice& operator=(const CudaNcclDevice&) = delete;

  std::string name() const override { return fmt::format("device {}", device_); }
  void make_current(const char* op) override {
    cuda::make_current(device_, fmt::format("nccl {}", op));
  }
  void* begin_operation(const char* op) override {
    const std::lock_guard lock(mutex_);
    if (comm_ == nullptr) make_stream(op);
    check(cudaEventRecord(before_, compute_), "cudaEventRecord", op);
    check(cudaStreamWaitEvent(comm_, before_, 0), "cudaStreamWaitEvent", op);
    return comm_;
  }
  void end_operation(const char* op) override {
    const std::lock_guard lock(mutex_);
    check(cudaEventRecord(after_, comm_), "cudaEventRecord", op);
    check(cudaStreamWaitEvent(compute_, after_, 0), "cudaStreamWaitEvent", op);
  }
  // A started operation: an event of its own recorded after it on the communication stream (the
  // events are pooled: one per request in flight), which the compute stream waits for only at
  // join(). cudaStreamWaitEvent takes the event's state at the call, so an event returned to the
  // pool may be recorded again at once.
  std::unique_ptr<Completion> end_started_operation(const char* op) override {
    const std::lock_guard lock(mutex_);
    cudaEvent_t event = nullptr;
    if (!free_.empty()) {
      event = free_.back();
      free_.pop_back();
    } else {
      check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate", op);
      started_.push_back(event);
    }
    if (const auto rc = cudaEventRecord(event, comm_); rc != cudaSuccess) {
      free_.push_back(event);
      check(rc, "cudaEventRecord", op);
    }
    return std::make_unique<Started>(this, event);
  }
  bool idle() override {
    // The compute stream (possibly the legacy default stream 0), then the communication stream
    // once it exists.
    if (!query(compute_)) return false;
    const std::lock_guard lock(mutex_);
    return comm_ == nullptr || query(comm_);
  }
  bool waits_each_operation() const override { return false; }

 private:
  class Started final : public Completion {
   public:
    Started(CudaNcclDevice* device, cudaEvent_t event) : device_(device), event_(event) {}
    ~Started() override {
      const std::lock_guard lock(device_->mutex_);
      device_->free_.push_back(event_);
    }
    Started(const Started&) = delete;
    Started& operator=(const Started&) = delete;
    void join(const char* op) override {
      check(cudaStreamWaitEvent(device_->compute_, event_, 0), "cudaStreamWaitEvent", op);
    }

   private:
    CudaNcclDevice* device_;
    cudaEvent_t event_;
  };

  bool query(cudaStream_t s) const {
    const cudaError_t rc = cudaStreamQuery(s);
    if (rc == cudaErrorNotReady) return false;
    check(rc, "cudaStreamQuery", name());
    return true;
  }
  void make_stream(const char* op) {
    check(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking), "cudaStreamCreate", op);
    const unsigned flags = cudaEventDisableTiming;
    if (const auto rc = cudaEventCreateWithFlags(&before_, flags); rc != cudaSuccess) {
      cudaStreamDestroy(comm_);
      comm_ = nullptr;
      check(rc, "cudaEventCreate", op);
    }
    if (const auto rc = cudaEventCreateWithFlags(&after_, flags); rc != cudaSuccess) {
      cudaEventDestroy(before_);
      cudaStreamDestroy(comm_);
      comm_ = nullptr;
      check(rc, "cudaEventCreate", op);
    }
  }

  int device_;
  cudaStream_t compute_;
  std::mutex mutex_;
  cudaStream_t comm_ = nullptr;  // made by the first operation
  cudaEvent_t before_ = nullptr, after_ = nullptr;
  std::vector<cudaEvent_t> started_;  // every started operation's event made so far
  std::vector<cudaEvent_t> free_;     // ... of them, those no request holds
};

}  // namespace

std::shared_ptr<NcclDevice> make_cuda_nccl_device(int device, cudaStream_t compute) {
  return std::make_shared<CudaNcclDevice>(device, compute);
}

}  // namespace distmuon::cuda
