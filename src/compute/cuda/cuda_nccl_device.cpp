// The CUDA backend's NCCL device (cuda_nccl_device.h).
#include "compute/cuda/cuda_nccl_device.h"

#include <fmt/format.h>

#include <mutex>

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
  bool idle() override {
    // The compute stream (possibly the legacy default stream 0), then the communication stream
    // once it exists.
    if (!query(compute_)) return false;
    const std::lock_guard lock(mutex_);
    return comm_ == nullptr || query(comm_);
  }
  bool waits_each_operation() const override { return false; }

 private:
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
};

}  // namespace

std::shared_ptr<NcclDevice> make_cuda_nccl_device(int device, cudaStream_t compute) {
  return std::make_shared<CudaNcclDevice>(device, compute);
}

}  // namespace distmuon::cuda
