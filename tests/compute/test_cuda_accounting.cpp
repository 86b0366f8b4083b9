// The CUDA backend's device-side accounting (docs/gpu.md, "Memory" and "Statistics"):
//  - every scratch buffer (batched-reduction slots, the normalisation slot, bf16 operand copies)
//    goes through Compute::allocate, so memory_stats() counts it, and is kept: a repeated call
//    allocates nothing;
//  - the stream timer measures queued work on the device: more than the host's enqueue time,
//    no more than the host's wall time around it, and at least what no GPU could beat;
//  - a timed data plane (NCCL) adds nothing to the host clock: its collectives are device
//    intervals; a Muon step's communication time lies between 0 and its total time, and steps
//    after the first allocate nothing;
//  - a call from a thread whose current device is another one runs on the backend's device.
// The bound used as "no GPU could beat it": 1e13 bytes/s of device memory traffic (an H200 has
// 4.8e12). Every test is skipped without a CUDA device.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "cuda_test_util.h"
#include "distmuon/comm.h"
#include "distmuon/muon.h"
#include "optim/timed_comm.h"
#include "test_util.h"

namespace distmuon {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(CudaAccounting, ScratchBuffersAreCountedAndKept) {
  DISTMUON_REQUIRE_CUDA();
  auto cuda = make_cuda_compute();
  const Matrix a = test::random_matrix(40, 30, 1);
  DeviceMatrix d = to_device(*cuda, a.view());
  const std::vector<ConstMatrixView> three(3, d.view());
  std::vector<double> sums(3);
  std::vector<std::optional<MatrixIndex>> found(3);

  MemoryStats s = cuda->memory_stats();
  cuda->sum_squares(three, true, sums);  // the result slots (4096 bytes at least)
  EXPECT_EQ(cuda->memory_stats().allocations, s.allocations + 1);
  EXPECT_GE(cuda->memory_stats().live_bytes, s.live_bytes + 4096);
  s = cuda->memory_stats();
  cuda->sum_squares(three, true, sums);
  cuda->find_non_finite(three, found);
  EXPECT_EQ(cuda->memory_stats().allocations, s.allocations) << "the slots are kept";

  cuda->normalize(d.view(), 1e-7, true, nullptr);  // the normalisation slot
  EXPECT_EQ(cuda->memory_stats().allocations, s.allocations + 1);
  s = cuda->memory_stats();
  cuda->normalize(d.view(), 1e-7, true, nullptr);
  EXPECT_EQ(cuda->memory_stats().allocations, s.allocations);

  // More results than the slots hold: they grow (one allocation, one release), then stay.
  const std::vector<ConstMatrixView> many(1000, d.view());
  std::vector<double> many_sums(many.size());
  cuda->sum_squares(many, true, many_sums);
  EXPECT_EQ(cuda->memory_stats().allocations, s.allocations + 1);
  EXPECT_EQ(cuda->memory_stats().releases, s.releases + 1);
  EXPECT_DOUBLE_EQ(many_sums[999], many_sums[0]);
  s = cuda->memory_stats();
  cuda->sum_squares(many, true, many_sums);
  EXPECT_EQ(cuda->memory_stats().allocations, s.allocations);
}

TEST(CudaAccounting, Bf16OperandCopiesAreCounted) {
  DISTMUON_REQUIRE_CUDA();
  auto cuda = make_cuda_compute();
  DeviceMatrix a = to_device(*cuda, test::random_matrix(64, 32, 2).view());
  DeviceMatrix b = to_device(*cuda, test::random_matrix(32, 48, 3).view());
  DeviceMatrix c(*cuda, 64, 48), g(*cuda, 64, 64);
  MemoryStats s = cuda->memory_stats();
  cuda->gemm(Trans::kNo, Trans::kNo, 1.0f, a, b, 0.0f, c, Precision::kBf16);  // two bf16 copies
  EXPECT_EQ(cuda->memory_stats().allocations, s.allocations + 2);
  EXPECT_GE(cuda->memory_stats().live_bytes, s.live_bytes + (64 * 32 + 32 * 48) * 2);
  s = cuda->memory_stats();
  cuda->syrk(Trans::kNo, 1.0f, a, 0.0f, g, Precision::kBf16);      // fits the first copy
  EXPECT_EQ(cuda->memory_stats().allocations, s.allocations + 1);  // the block pointers
  s = cuda->memory_stats();
  cuda->gemm(Trans::kNo, Trans::kNo, 1.0f, a, b, 0.0f, c, Precision::kBf16);
  cuda->syrk(Trans::kNo, 1.0f, a, 0.0f, g, Precision::kBf16);
  cuda->synchronize();
  EXPECT_EQ(cuda->memory_stats().allocations, s.allocations);
}

TEST(CudaAccounting, StreamTimerMeasuresTheQueuedWork) {
  DISTMUON_REQUIRE_CUDA();
  auto cuda = make_cuda_compute();
  auto timer = cuda->stream_timer();
  ASSERT_NE(timer, nullptr);
  EXPECT_EQ(timer->seconds(), 0.0);  // no interval
  // Memory-bound work whatever the products' precision: axpby reads two 64 MB matrices and
  // writes one, 192 MB of traffic per call.
  constexpr Index n = 4096;
  constexpr int reps = 8;
  DeviceMatrix x = to_device(*cuda, test::random_matrix(n, n, 4).view()), y(*cuda, n, n);
  cuda->axpby(0.5f, x, 0.5f, y);  // warm-up
  cuda->synchronize();

  const auto t0 = std::chrono::steady_clock::now();
  timer->start();
  for (int i = 0; i < reps; ++i)
    cuda->axpby(0.5f, x, 0.5f, y);
  timer->stop();
  const double enqueue = seconds_since(t0);
  const double device = timer->seconds();  // waits for the kernels
  const double wall = seconds_since(t0);
  const double bytes = 3.0 * n * n * sizeof(float) * reps;
  EXPECT_GE(device, bytes / 1e13) << "faster than any GPU's memory";
  EXPECT_GT(device, enqueue) << "the host's enqueue time, not the device's";
  EXPECT_LE(device, wall + 1e-4) << "longer than the host waited";
  EXPECT_EQ(timer->seconds(), 0.0) << "read once";

  timer->start();
  cuda->axpby(0.5f, x, 0.5f, y);
  timer->stop();
  timer->clear();
  EXPECT_EQ(timer->seconds(), 0.0) << "cleared";
}

TEST(CudaAccounting, TimedDataPlaneIsDeviceTime) {
  DISTMUON_REQUIRE_CUDA();
  auto cuda = make_cuda_compute();
  auto timer = cuda->stream_timer();
  auto host_seconds = std::make_shared<double>(0.0);
  const Communicator timed = detail::timed_communicator(
      cuda->data_communicator(local_communicator()), host_seconds, timer.get());
  ASSERT_EQ(timed.data().backend(), "nccl");
  constexpr std::size_t count = std::size_t{16} << 20;  // 64 MB
  DeviceMatrix send(*cuda, 1, static_cast<Index>(count)), recv(*cuda, 1, static_cast<Index>(count));
  timed.data().all_gather(std::span<const float>(send.view().data, count),
                          std::span<float>(recv.view().data, count));  // connects NCCL
  timer->clear();
  const auto t0 = std::chrono::steady_clock::now();
  timed.data().all_gather(std::span<const float>(send.view().data, count),
                          std::span<float>(recv.view().data, count));
  const double device = timer->seconds();
  const double wall = seconds_since(t0);
  EXPECT_EQ(*host_seconds, 0.0) << "the data plane is not on the host clock";
  EXPECT_GE(device, 2.0 * count * sizeof(float) / 1e13) << "faster than any GPU's memory";
  EXPECT_LE(device, wall + 1e-4);
}

TEST(CudaAccounting, MuonStepsCountAndTimeOnTheDevice) {
  DISTMUON_REQUIRE_CUDA();
  Compute& cuda = cuda_compute();
  MuonOptions o;
  o.tp_mode = TpMode::kDistributed;
  Muon opt(o, local_communicator(), cuda);
  DeviceMatrix w = to_device(cuda, test::random_matrix(256, 192, 5).view());
  DeviceMatrix g(cuda, 256, 192);
  ParamSpec s;
  s.name = "w";
  s.local = w.view();
  s.rows = 256;
  s.cols = 192;
  opt.add_parameter(s);
  std::size_t after_first = 0;
  for (int step = 0; step < 3; ++step) {
    cuda.copy_from_host(test::random_matrix(256, 192, 10 + step).view(), g.view());
    const std::vector<ConstMatrixView> grads{g.view()};
    opt.step(grads);
    const MuonStepStats st = opt.last_step_stats();
    EXPECT_GE(st.comm_s, 0.0);
    EXPECT_LE(st.comm_s, st.total_s) << "step " << step;
    if (step == 0) after_first = cuda.memory_stats().allocations;
  }
  EXPECT_EQ(cuda.memory_stats().allocations, after_first) << "steps after the first allocate";
}

TEST(CudaAccounting, CallsFromAnotherThreadRunOnTheBackendsDevice) {
  DISTMUON_REQUIRE_CUDA();
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  Compute& cuda = cuda_compute();
  DeviceMatrix d(cuda, 8, 8);
  double sum = -1.0;
  int current = -1;
  std::thread worker([&] {
    // Another device current on this thread where the machine has one.
    if (cuda_device_count() > 1) cudaSetDevice((device + 1) % cuda_device_count());
    cuda.fill(d.view(), 2.0f);
    sum = cuda.sum_squares(d.view(), true);
    cudaGetDevice(&current);
  });
  worker.join();
  EXPECT_EQ(sum, 64 * 4.0);
  EXPECT_EQ(current, device) << "the backend made its device current";
}

}  // namespace
}  // namespace distmuon
