// Backend-owned memory on the CPU backend: DeviceMatrix allocates zeroed memory through the
// backend, reuses it when the shape is unchanged, releases it, and every allocation is counted.
#include <gtest/gtest.h>

#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

TEST(DeviceMemory, AllocationsAreCountedAndReleased) {
  Compute& c = cpu_compute();
  const MemoryStats before = c.memory_stats();
  {
    DeviceMatrix a(c, 3, 5);
    EXPECT_EQ(a.rows(), 3);
    EXPECT_EQ(a.cols(), 5);
    EXPECT_EQ(c.memory_stats().allocations, before.allocations + 1);
    EXPECT_EQ(c.memory_stats().live_bytes, before.live_bytes + 15 * sizeof(float));
    for (Index i = 0; i < a.size(); ++i)
      EXPECT_EQ(a.view().data[i], 0.0f) << "zero-filled at " << i;
    a.ensure(c, 3, 5);  // same shape: no new allocation
    EXPECT_EQ(c.memory_stats().allocations, before.allocations + 1);
    a.ensure(c, 4, 5);
    EXPECT_EQ(c.memory_stats().allocations, before.allocations + 2);
    EXPECT_EQ(c.memory_stats().releases, before.releases + 1);
    DeviceMatrix b = std::move(a);  // a move allocates nothing
    EXPECT_EQ(a.size(), 0);
    EXPECT_EQ(b.rows(), 4);
    EXPECT_EQ(c.memory_stats().allocations, before.allocations + 2);
  }
  EXPECT_EQ(c.memory_stats().live_bytes, before.live_bytes);
  EXPECT_GE(c.memory_stats().peak_bytes, 20 * sizeof(float));
}

TEST(DeviceMemory, EmptyMatrixAllocatesNothing) {
  Compute& c = cpu_compute();
  const MemoryStats before = c.memory_stats();
  DeviceMatrix a(c, 0, 7);
  EXPECT_EQ(a.view().data, nullptr);
  EXPECT_EQ(c.memory_stats().allocations, before.allocations);
  EXPECT_THROW(DeviceMatrix(c, -1, 2), Error);
}

TEST(DeviceMemory, HostRoundTrip) {
  Compute& c = cpu_compute();
  Matrix h(2, 3, {1, 2, 3, 4, 5, 6});
  const DeviceMatrix d = to_device(c, h);
  const Matrix back = to_host(c, d);
  EXPECT_EQ(back.values()[5], 6.0f);
  EXPECT_EQ(relative_error(back, h), 0.0);
}

TEST(DeviceMemory, BackendsByName) {
  EXPECT_EQ(&compute_backend("cpu"), &cpu_compute());
  EXPECT_EQ(compute_backend("opaque").memory(), MemoryKind::kDevice);
  EXPECT_THROW(compute_backend("tpu"), Error);
  if (compute_backend_names().size() == 2) EXPECT_THROW(compute_backend("cuda"), Error);
}

}  // namespace
}  // namespace distmuon
