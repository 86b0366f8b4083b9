// The opaque test backend: its memory faults on any host access, it refuses host memory where
// its own belongs (and the reverse), its results are bit-equal to the CPU backend's (the same
// code runs on its private storage: tolerance 0), and its data communicator moves its memory
// between ranks while the control plane stays on the host.
#include <gtest/gtest.h>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon {
namespace {

TEST(OpaqueComputeDeathTest, HostAccessFaults) {
  if (test::world().size() > 1) GTEST_SKIP() << "death tests run in the one-rank test";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto opaque = make_opaque_compute();
  DeviceMatrix a(*opaque, 4, 4);
  const float* p = a.view().data;
  EXPECT_DEATH(
      {
        volatile float x = p[0];
        (void)x;
      },
      "");
  EXPECT_DEATH({ a.view().data[3] = 1.0f; }, "");
}

TEST(OpaqueCompute, RefusesMemoryThatIsNotItsOwn) {
  auto opaque = make_opaque_compute();
  Matrix host(3, 3);
  DeviceMatrix d(*opaque, 3, 3);
  EXPECT_THROW(opaque->scale(host.view(), 2.0f), Error);
  EXPECT_THROW(opaque->copy(host.view(), d.view()), Error);
  EXPECT_THROW(opaque->copy_from_host(d.view(), d.view()), Error);
  EXPECT_THROW(opaque->copy_to_host(d.view(), d.view()), Error);
  // A view running past the end of its allocation is not its memory either.
  const MatrixView past{d.view().data, 4, 3, 3};
  EXPECT_THROW(opaque->fill(past, 0.0f), Error);
  // Nor is another opaque backend's memory.
  auto other = make_opaque_compute();
  DeviceMatrix e(*other, 3, 3);
  EXPECT_THROW(opaque->copy(e.view(), d.view()), Error);
}

TEST(OpaqueCompute, BitEqualToCpu) {
  auto opaque = make_opaque_compute();
  Compute& cpu = cpu_compute();
  const Matrix a = test::random_matrix(37, 21, 1), b = test::random_matrix(21, 29, 2);
  // gemm, syrk, scale, axpby, add_diagonal on both backends.
  Matrix c_cpu(37, 29), s_cpu(37, 37);
  cpu.gemm(Trans::kNo, Trans::kNo, 0.5f, a, b, 0.0f, c_cpu);
  cpu.syrk(Trans::kNo, 1.0f, a, 0.0f, s_cpu);
  cpu.add_diagonal(s_cpu, 0.25f);
  cpu.axpby(2.0f, c_cpu, -1.0f, c_cpu);
  DeviceMatrix da = to_device(*opaque, a), db = to_device(*opaque, b);
  DeviceMatrix dc(*opaque, 37, 29), ds(*opaque, 37, 37);
  opaque->gemm(Trans::kNo, Trans::kNo, 0.5f, da, db, 0.0f, dc);
  opaque->syrk(Trans::kNo, 1.0f, da, 0.0f, ds);
  opaque->add_diagonal(ds, 0.25f);
  opaque->axpby(2.0f, dc, -1.0f, dc);
  EXPECT_EQ(relative_error(to_host(*opaque, dc), c_cpu), 0.0);
  EXPECT_EQ(relative_error(to_host(*opaque, ds), s_cpu), 0.0);
  EXPECT_EQ(opaque->sum_squares(da, true), cpu.sum_squares(a, true));
  // A strided sub-view of its memory is its memory.
  const ConstMatrixView sub = da.view().block(2, 3, 5, 4);
  EXPECT_EQ(opaque->sum_squares(sub, false), cpu.sum_squares(a.view().block(2, 3, 5, 4), false));
  // Batched reductions.
  const std::vector<ConstMatrixView> both{da.view(), db.view()};
  std::vector<double> ss(2);
  opaque->sum_squares(both, true, ss);
  EXPECT_EQ(ss[1], cpu.sum_squares(b, true));
  opaque->fill(dc.view().block(1, 2, 1, 1), std::numeric_limits<float>::infinity());
  const std::vector<ConstMatrixView> cs{da.view(), dc.view()};
  std::vector<std::optional<MatrixIndex>> bad(2);
  opaque->find_non_finite(cs, bad);
  EXPECT_FALSE(bad[0]);
  ASSERT_TRUE(bad[1]);
  EXPECT_EQ(bad[1]->row, 1);
  EXPECT_EQ(bad[1]->col, 2);
}

TEST(OpaqueCompute, ReleasedMemoryIsReusedNotLeaked) {
  auto opaque = make_opaque_compute();
  for (int i = 0; i < 100; ++i)
    DeviceMatrix(*opaque, 1000, 1000);
  EXPECT_EQ(opaque->memory_stats().allocations, 100u);
  EXPECT_EQ(opaque->memory_stats().live_bytes, 0u);
}

TEST(OpaqueCompute, DataPlaneMovesBackendMemory) {
  auto opaque = make_opaque_compute();
  const Communicator group = opaque->data_communicator(test::world());
  const int n = group.size(), r = group.rank();
  ASSERT_TRUE(group.has_data_plane());
  Matrix mine(2, 3);
  for (float& v : mine.values())
    v = static_cast<float>(r + 1);
  DeviceMatrix send = to_device(*opaque, mine), recv(*opaque, 2 * n, 3);
  group.data().all_gather<float>({send.view().data, 6},
                                 {recv.view().data, static_cast<std::size_t>(6 * n)});
  const Matrix all = to_host(*opaque, recv);
  for (int k = 0; k < n; ++k)
    EXPECT_EQ(all(2 * k + 1, 2), static_cast<float>(k + 1));
  group.data().all_reduce<float>({send.view().data, 6});
  EXPECT_EQ(to_host(*opaque, send)(1, 1), static_cast<float>(n * (n + 1) / 2));
  // Host memory on the data plane is refused; the control plane carries host scalars.
  EXPECT_THROW(group.data().all_reduce<float>(mine.values()), Error);
  EXPECT_EQ(group.all_reduce(1), n);
}

}  // namespace
}  // namespace distmuon
