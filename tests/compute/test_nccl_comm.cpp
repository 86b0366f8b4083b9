// The NCCL data plane of the CUDA backend (Compute::data_communicator) at two ranks, one GPU
// each: every collective on device memory against the values the host communicator's contract
// gives, computed on the host. Exact (tolerance 0): sums of small integers in fp32 are exact.
// Skipped ("... CUDA devices: skipped") unless there are two ranks and two CUDA devices.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"
#include "test_util.h"

namespace distmuon {
namespace {

// A CUDA backend on this rank's own device, or nullptr after GTEST_SKIP.
Compute* rank_backend() {
  const Communicator& world = test::world();
  const int devices = cuda_device_count();
  if (world.size() < 2 || devices < world.size()) return nullptr;
  if (cudaSetDevice(world.rank() % devices) != cudaSuccess) return nullptr;
  return &cuda_compute();
}

Matrix filled(Index rows, Index cols, float base) {
  Matrix m(rows, cols);
  for (Index i = 0; i < rows; ++i) {
    for (Index j = 0; j < cols; ++j)
      m(i, j) = base + static_cast<float>(i * cols + j);
  }
  return m;
}

TEST(NcclComm, CollectivesOnDeviceMemory) {
  Compute* cuda = rank_backend();
  if (cuda == nullptr) {
    GTEST_SKIP() << "needs 2 ranks and a CUDA device per rank (" << cuda_device_count()
                 << " CUDA devices): skipped";
  }
  const Communicator& world = test::world();
  const Communicator comm = cuda->data_communicator(world);
  ASSERT_TRUE(comm.has_data_plane());
  EXPECT_EQ(comm.data().backend(), "nccl");
  // Made once per host group: the same NCCL communicator the second time.
  EXPECT_EQ(cuda->data_communicator(world).data().impl_ptr(), comm.data().impl_ptr());
  const int r = world.rank(), p = world.size();
  const Communicator data = comm.data();

  // all_reduce (sum, max), all_gather, reduce_scatter, broadcast.
  const Matrix mine = filled(4, 6, 100.0f * static_cast<float>(r));
  DeviceMatrix d = to_device(*cuda, mine.view());
  data.all_reduce(std::span<float>(d.view().data, 24));
  Matrix want(4, 6);
  for (int k = 0; k < p; ++k)
    cpu_compute().axpby(1.0f, filled(4, 6, 100.0f * static_cast<float>(k)).view(), 1.0f,
                        want.view());
  EXPECT_EQ(relative_error(to_host(*cuda, d.view()).view(), want.view()), 0.0);

  DeviceMatrix gathered(*cuda, 4 * p, 6);
  const DeviceMatrix src = to_device(*cuda, mine.view());
  data.all_gather(std::span<const float>(src.view().data, 24),
                  std::span<float>(gathered.view().data, static_cast<std::size_t>(24 * p)));
  const Matrix g = to_host(*cuda, gathered.view());
  for (int k = 0; k < p; ++k) {
    EXPECT_EQ(relative_error(Matrix::from(g.view().row_block(4 * k, 4)).view(),
                             filled(4, 6, 100.0f * static_cast<float>(k)).view()),
              0.0);
  }

  DeviceMatrix part(*cuda, 2, 6);
  data.reduce_scatter(
      std::span<const float>(gathered.view().data, static_cast<std::size_t>(24 * p)),
      std::span<float>(part.view().data, 12));
  Matrix want_part(2, 6);
  for (int k = 0; k < p; ++k)
    cpu_compute().axpby(1.0f, g.view().row_block(2 * r, 2), 1.0f, want_part.view());
  EXPECT_EQ(relative_error(to_host(*cuda, part.view()).view(), want_part.view()), 0.0);

  DeviceMatrix b = to_device(*cuda, mine.view());
  data.broadcast(std::span<float>(b.view().data, 24), 1);
  EXPECT_EQ(relative_error(to_host(*cuda, b.view()).view(), filled(4, 6, 100.0f).view()), 0.0);

  // all_to_all_v: rank r sends r + k + 1 elements to rank k.
  std::vector<std::size_t> send_counts(static_cast<std::size_t>(p)), recv_counts(send_counts);
  std::size_t send_total = 0, recv_total = 0;
  for (int k = 0; k < p; ++k) {
    send_counts[static_cast<std::size_t>(k)] = static_cast<std::size_t>(r + k + 1);
    recv_counts[static_cast<std::size_t>(k)] = static_cast<std::size_t>(k + r + 1);
    send_total += send_counts[static_cast<std::size_t>(k)];
    recv_total += recv_counts[static_cast<std::size_t>(k)];
  }
  Matrix send_host(1, static_cast<Index>(send_total));
  for (Index i = 0; i < send_host.cols(); ++i)
    send_host(0, i) = static_cast<float>(1000 * r + i);
  const DeviceMatrix send = to_device(*cuda, send_host.view());
  DeviceMatrix recv(*cuda, 1, static_cast<Index>(recv_total));
  data.all_to_all_v(std::span<const float>(send.view().data, send_total),
                    std::span<const std::size_t>(send_counts),
                    std::span<float>(recv.view().data, recv_total),
                    std::span<const std::size_t>(recv_counts));
  const Matrix got = to_host(*cuda, recv.view());
  Index at = 0;
  for (int k = 0; k < p; ++k) {
    Index offset = 0;  // where rank k's chunk for rank r starts in rank k's send buffer
    for (int q = 0; q < r; ++q)
      offset += k + q + 1;
    for (Index i = 0; i < k + r + 1; ++i, ++at)
      EXPECT_EQ(got(0, at), static_cast<float>(1000 * k + offset + i)) << "from rank " << k;
  }
  data.barrier();

  // split: the NCCL communicator of a one-rank group per rank.
  const Communicator alone = comm.data().split(r, 0);
  EXPECT_EQ(alone.size(), 1);
  DeviceMatrix one = to_device(*cuda, mine.view());
  alone.all_reduce(std::span<float>(one.view().data, 24));
  EXPECT_EQ(relative_error(to_host(*cuda, one.view()).view(), mine.view()), 0.0);
}

}  // namespace
}  // namespace distmuon
