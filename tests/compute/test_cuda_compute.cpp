// The CUDA backend against the CPU backend, method by method, on the same inputs (strided views
// included). Tolerances, and why:
//  - elementwise operations (scale, axpby, add_diagonal, fill, copy, muon_momentum, adamw) and
//    find_non_finite: 0. The kernels evaluate the CPU backend's float expressions in the same
//    order, compiled without fused multiply-adds (cuda_kernels.cu), and IEEE division and square
//    root round the same on both.
//  - gemm, syrk in fp32: relative Frobenius error 1e-5. Both sum k products in fp32 in different
//    orders; the error of either is about sqrt(k) 2^-24 relative (k <= 300 here), well below 1e-5.
//  - TF32 (10-bit mantissa, inputs rounded to 2^-11 relative): 5e-3; bf16 (7-bit mantissa,
//    2^-8): 2e-2. All accumulate in fp32, so the inputs' rounding dominates. Against the CPU's
//    emulation of the same precision (precision.h: operands rounded alike, sgemm): 1e-5 for bf16
//    (the same rounded operands, fp32 sums in another order); tf32 5e-3, since cuBLAS does not
//    document its conversion (round to nearest or truncation).
//  - sum_squares: in double 1e-12 relative (the order of the double sums differs); in float
//    1e-5 relative to the double sum (fp32 partial sums over <= 1e4 elements of one sign).
// Every test is skipped ("no CUDA device: skipped") on a machine without a CUDA device.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "distmuon/comm.h"
#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon {
namespace {

// A host matrix embedded, at column offset 3, in a wider one: a strided view of ld cols + 5.
struct Strided {
  Matrix storage;
  MatrixView view;
};
Strided strided(const Matrix& m) {
  Strided s{Matrix(m.rows(), m.cols() + 5), {}};
  s.view = s.storage.view().block(0, 3, m.rows(), m.cols());
  cpu_compute().copy(m.view(), s.view);
  return s;
}

// The same strided layout in device memory: a DeviceMatrix cols + 5 wide and its inner view.
struct DevStrided {
  DeviceMatrix storage;
  MatrixView view;
};
DevStrided dev_strided(Compute& cuda, const Matrix& m) {
  DevStrided d{DeviceMatrix(cuda, m.rows(), m.cols() + 5), {}};
  d.view = d.storage.view().block(0, 3, m.rows(), m.cols());
  cuda.copy_from_host(m.view(), d.view);
  return d;
}

Matrix host_of(Compute& cuda, ConstMatrixView v) {
  return to_host(cuda, v);
}

TEST(CudaCompute, ReportsDeviceMemory) {
  DISTMUON_REQUIRE_CUDA();
  Compute& cuda = cuda_compute();
  EXPECT_EQ(cuda.memory(), MemoryKind::kDevice);
  EXPECT_EQ(&compute_backend("cuda"), &cuda);
  const MemoryStats before = cuda.memory_stats();
  {
    DeviceMatrix a(cuda, 17, 9);
    const Matrix zeros = host_of(cuda, a);  // allocation is zero-filled
    EXPECT_EQ(cpu_compute().sum_squares(zeros.view(), true), 0.0);
  }
  const MemoryStats after = cuda.memory_stats();
  EXPECT_EQ(after.allocations, before.allocations + 1);
  EXPECT_EQ(after.releases, before.releases + 1);
  EXPECT_EQ(after.live_bytes, before.live_bytes);
}

TEST(CudaCompute, HostCopiesRoundTripStridedViews) {
  DISTMUON_REQUIRE_CUDA();
  Compute& cuda = cuda_compute();
  const Matrix a = test::random_matrix(13, 7, 1);
  DevStrided d = dev_strided(cuda, a);
  Strided back = strided(Matrix(13, 7));
  cuda.copy_to_host(d.view, back.view);
  EXPECT_EQ(relative_error(Matrix::from(back.view).view(), a.view()), 0.0);
  EXPECT_THROW(cuda.copy_from_host(a.view(), DeviceMatrix(cuda, 7, 13).view()), Error);
  // Host memory where device memory belongs, and the reverse, are refused.
  Matrix host(13, 7);
  EXPECT_THROW(cuda.copy_from_host(a.view(), host.view()), Error);
  EXPECT_THROW(cuda.copy_to_host(a.view(), host.view()), Error);
  EXPECT_THROW(cuda.copy_from_host(d.view, d.view), Error);
}

// The data plane of a one-rank group: an NCCL communicator of one rank (no MPI needed), whose
// collectives move device memory (all_reduce and broadcast: unchanged; all_gather: a copy).
TEST(CudaCompute, OneRankDataCommunicatorIsNccl) {
  DISTMUON_REQUIRE_CUDA();
  Compute& cuda = cuda_compute();
  const Communicator host = local_communicator();
  const Communicator comm = cuda.data_communicator(host);
  ASSERT_TRUE(comm.has_data_plane());
  EXPECT_EQ(comm.data().backend(), "nccl");
  EXPECT_EQ(comm.backend(), host.backend());  // the control plane stays on the host
  const Matrix a = test::random_matrix(6, 5, 3);
  DeviceMatrix d = to_device(cuda, a.view()), out(cuda, 6, 5);
  comm.data().all_reduce(std::span<float>(d.view().data, 30));
  comm.data().broadcast(std::span<float>(d.view().data, 30), 0);
  comm.data().all_gather(std::span<const float>(d.view().data, 30),
                         std::span<float>(out.view().data, 30));
  comm.data().barrier();
  EXPECT_EQ(relative_error(to_host(cuda, out.view()).view(), a.view()), 0.0);
  EXPECT_EQ(relative_error(to_host(cuda, d.view()).view(), a.view()), 0.0);
}

TEST(CudaCompute, GemmAndSyrkMatchCpuInEveryPrecision) {
  DISTMUON_REQUIRE_CUDA();
  Compute& cpu = cpu_compute();
  struct Case {
    Precision precision;
    double tolerance, emulated;
  };
  auto cuda = make_cuda_compute();  // one backend: the precision is each call's
  for (const Case& c : {Case{Precision::kFp32, 1e-5, 1e-5}, Case{Precision::kTf32, 5e-3, 5e-3},
                        Case{Precision::kBf16, 2e-2, 1e-5}}) {
    SCOPED_TRACE(to_string(c.precision));
    for (const Trans ta : {Trans::kNo, Trans::kYes}) {
      for (const Trans tb : {Trans::kNo, Trans::kYes}) {
        // op(a) 37 x 300, op(b) 300 x 29; c starts non-zero (beta = 0.5).
        const Matrix a =
            ta == Trans::kNo ? test::random_matrix(37, 300, 2) : test::random_matrix(300, 37, 2);
        const Matrix b =
            tb == Trans::kNo ? test::random_matrix(300, 29, 3) : test::random_matrix(29, 300, 3);
        const Matrix c0 = test::random_matrix(37, 29, 4);
        Strided want = strided(c0);
        cpu.gemm(ta, tb, 0.75f, a.view(), b.view(), 0.5f, want.view);
        Strided emulated = strided(c0);
        cpu.gemm(ta, tb, 0.75f, a.view(), b.view(), 0.5f, emulated.view, c.precision);
        DevStrided da = dev_strided(*cuda, a), db = dev_strided(*cuda, b);
        DevStrided dc = dev_strided(*cuda, c0);
        cuda->gemm(ta, tb, 0.75f, da.view, db.view, 0.5f, dc.view, c.precision);
        const Matrix got = host_of(*cuda, dc.view);
        EXPECT_LE(relative_error(got.view(), Matrix::from(want.view).view()), c.tolerance);
        EXPECT_LE(relative_error(got.view(), Matrix::from(emulated.view).view()), c.emulated);
      }
    }
    for (const Trans ta : {Trans::kNo, Trans::kYes}) {
      const Matrix a =
          ta == Trans::kNo ? test::random_matrix(45, 200, 5) : test::random_matrix(200, 45, 5);
      const Matrix c0 = test::random_matrix(45, 45, 6);
      Matrix sym(45, 45);  // a symmetric start for beta != 0
      cpu.gemm(Trans::kNo, Trans::kYes, 1.0f, c0.view(), c0.view(), 0.0f, sym.view());
      Strided want = strided(sym);
      cpu.syrk(ta, 0.5f, a.view(), 0.25f, want.view);
      DevStrided da = dev_strided(*cuda, a), dc = dev_strided(*cuda, sym);
      cuda->syrk(ta, 0.5f, da.view, 0.25f, dc.view, c.precision);
      const Matrix got = host_of(*cuda, dc.view);
      EXPECT_LE(relative_error(got.view(), Matrix::from(want.view).view()), c.tolerance);
      for (Index i = 0; i < 45; ++i) {  // both triangles written, and equal
        for (Index j = 0; j < i; ++j)
          ASSERT_EQ(got(i, j), got(j, i)) << i << "," << j;
      }
    }
    // Shapes that do not fit are refused with distmuon::Error.
    DeviceMatrix x(*cuda, 3, 4), y(*cuda, 5, 3);
    EXPECT_THROW(cuda->gemm(Trans::kNo, Trans::kNo, 1.0f, x, y, 0.0f, y), Error);
    EXPECT_THROW(cuda->syrk(Trans::kNo, 1.0f, x, 0.0f, y), Error);
  }
}

// At a reduced precision syrk runs as one batched product of the blocks on and above the
// diagonal (2, 4 and 8 blocks a side at these sizes), the lower triangle mirrored: the same
// tolerances as above, both triangles written and equal, strided a and c.
TEST(CudaCompute, ReducedPrecisionSyrkInBlocksMatchesCpu) {
  DISTMUON_REQUIRE_CUDA();
  Compute& cpu = cpu_compute();
  for (const auto& [precision, tolerance] :
       {std::pair{Precision::kTf32, 5e-3}, std::pair{Precision::kBf16, 2e-2}}) {
    auto cuda = make_cuda_compute();
    for (const Index n : {2048, 4096, 8192}) {
      for (const Trans ta : {Trans::kNo, Trans::kYes}) {
        SCOPED_TRACE(fmt::format("{} n {} ta {}", to_string(precision), n, ta == Trans::kYes));
        const Index k = 24;
        const Matrix a =
            ta == Trans::kNo ? test::random_matrix(n, k, 7) : test::random_matrix(k, n, 7);
        const Matrix c0 = test::random_matrix(n, 3, 8);
        Matrix sym(n, n);  // a symmetric start for beta != 0
        cpu.gemm(Trans::kNo, Trans::kYes, 1.0f, c0.view(), c0.view(), 0.0f, sym.view());
        Strided want = strided(sym);
        cpu.syrk(ta, 0.5f, a.view(), 0.25f, want.view);  // fp32: the reference
        DevStrided da = dev_strided(*cuda, a), dc = dev_strided(*cuda, sym);
        cuda->syrk(ta, 0.5f, da.view, 0.25f, dc.view, precision);
        const Matrix got = host_of(*cuda, dc.view);
        EXPECT_LE(relative_error(got.view(), Matrix::from(want.view).view()), tolerance);
        Index asymmetric = 0;
        for (Index i = 0; i < n; ++i) {
          for (Index j = 0; j < i; ++j)
            asymmetric += got(i, j) != got(j, i) ? 1 : 0;
        }
        EXPECT_EQ(asymmetric, 0);
      }
    }
  }
}

TEST(CudaCompute, ElementwiseOperationsAreBitEqualToCpu) {
  DISTMUON_REQUIRE_CUDA();
  Compute& cuda = cuda_compute();
  Compute& cpu = cpu_compute();
  const Matrix x = test::random_matrix(31, 23, 7), y = test::random_matrix(31, 23, 8);
  const auto both = [&](auto&& op) {
    Strided h = strided(y);
    DevStrided d = dev_strided(cuda, y);
    op(cpu, h.view, x.view());
    const DeviceMatrix dx = to_device(cuda, x);
    op(cuda, d.view, dx.view());
    return relative_error(host_of(cuda, d.view).view(), Matrix::from(h.view).view());
  };
  EXPECT_EQ(both([](Compute& c, MatrixView a, ConstMatrixView) { c.scale(a, -1.5f); }), 0.0);
  EXPECT_EQ(both([](Compute& c, MatrixView a, ConstMatrixView) { c.scale(a, 0.0f); }), 0.0);
  EXPECT_EQ(both([](Compute& c, MatrixView a, ConstMatrixView b) { c.axpby(0.3f, b, 0.7f, a); }),
            0.0);
  EXPECT_EQ(both([](Compute& c, MatrixView a, ConstMatrixView b) { c.axpby(0.3f, b, 0.0f, a); }),
            0.0);
  EXPECT_EQ(both([](Compute& c, MatrixView a, ConstMatrixView) { c.fill(a, 2.5f); }), 0.0);
  for (const Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
    EXPECT_EQ(both([p](Compute& c, MatrixView a, ConstMatrixView) { c.round(a, p); }), 0.0)
        << to_string(p);
  }
  EXPECT_EQ(both([](Compute& c, MatrixView a, ConstMatrixView b) { c.copy(b, a); }), 0.0);
  EXPECT_EQ(both([](Compute& c, MatrixView a, ConstMatrixView) {
              c.add_diagonal(a.block(0, 0, 23, 23), 0.125f);
            }),
            0.0);
  EXPECT_EQ(both([](Compute& c, MatrixView a, ConstMatrixView b) {
              c.muon_momentum({.momentum = 0.95f, .l2 = 0.01f, .nesterov = true}, b, b, a, a);
            }),
            0.0);

  // muon_momentum and adamw with separate outputs.
  const Matrix g = test::random_matrix(19, 11, 9), w = test::random_matrix(19, 11, 10);
  Matrix buf = test::random_matrix(19, 11, 11), u(19, 11);
  DeviceMatrix dg = to_device(cuda, g), dw = to_device(cuda, w), dbuf = to_device(cuda, buf);
  DeviceMatrix du(cuda, 19, 11);
  for (const bool nesterov : {true, false}) {
    const MomentumStep k{.momentum = 0.9f, .l2 = 0.02f, .nesterov = nesterov};
    cpu.muon_momentum(k, g.view(), w.view(), buf.view(), u.view());
    cuda.muon_momentum(k, dg, dw, dbuf, du);
    EXPECT_EQ(relative_error(host_of(cuda, dbuf).view(), buf.view()), 0.0);
    EXPECT_EQ(relative_error(host_of(cuda, du).view(), u.view()), 0.0);
  }
  Matrix m = test::random_matrix(19, 11, 12), v(19, 11), p = test::random_matrix(19, 11, 13);
  cpu.fill(v.view(), 0.01f);
  DeviceMatrix dm = to_device(cuda, m), dv = to_device(cuda, v), dp = to_device(cuda, p);
  const AdamWStep k{.beta1 = 0.9f,
                    .beta2 = 0.999f,
                    .bias1 = 0.1f,
                    .bias2_sqrt = 0.0447f,
                    .decay = 0.999f,
                    .lr = 1e-3f,
                    .eps = 1e-8f};
  for (int step = 0; step < 3; ++step) {
    cpu.adamw(k, g.view(), m.view(), v.view(), p.view());
    cuda.adamw(k, dg, dm, dv, dp);
  }
  EXPECT_EQ(relative_error(host_of(cuda, dm).view(), m.view()), 0.0);
  EXPECT_EQ(relative_error(host_of(cuda, dv).view(), v.view()), 0.0);
  EXPECT_EQ(relative_error(host_of(cuda, dp).view(), p.view()), 0.0);

  DeviceMatrix other(cuda, 4, 4), wrong(cuda, 4, 5);
  EXPECT_THROW(cuda.axpby(1.0f, other, 1.0f, wrong), Error);
  EXPECT_THROW(cuda.copy(other, wrong), Error);
  EXPECT_THROW(cuda.add_diagonal(wrong, 1.0f), Error);
  EXPECT_THROW(cuda.muon_momentum({}, other, other, other, wrong), Error);
  EXPECT_THROW(cuda.adamw({}, other, other, wrong, other), Error);
}

TEST(CudaCompute, ReductionsMatchCpuOneMatrixAndBatched) {
  DISTMUON_REQUIRE_CUDA();
  Compute& cuda = cuda_compute();
  Compute& cpu = cpu_compute();
  std::vector<Matrix> hosts;
  std::vector<DeviceMatrix> devs;
  for (int i = 0; i < 5; ++i) {
    hosts.push_back(test::random_matrix(40 + 13 * i, 60 + 7 * i, 20 + i));
    devs.push_back(to_device(cuda, hosts.back()));
  }
  std::vector<ConstMatrixView> views;
  for (const DeviceMatrix& d : devs)
    views.push_back(d.view().block(1, 2, d.rows() - 1, d.cols() - 3));  // strided
  std::vector<double> sums(views.size());
  cuda.sum_squares(views, true, sums);
  std::vector<double> float_sums(views.size());
  cuda.sum_squares(views, false, float_sums);
  for (std::size_t i = 0; i < views.size(); ++i) {
    const ConstMatrixView h = hosts[i].view().block(1, 2, views[i].rows, views[i].cols);
    const double want = cpu.sum_squares(h, true);
    EXPECT_NEAR(sums[i], want, 1e-12 * want);
    EXPECT_NEAR(cuda.sum_squares(views[i], true), want, 1e-12 * want);
    EXPECT_NEAR(float_sums[i], want, 1e-5 * want);
  }

  // find_non_finite: the first non-finite element in row-major order, per matrix.
  Matrix bad = test::random_matrix(50, 70, 30);
  bad(33, 5) = std::numeric_limits<float>::infinity();
  bad(12, 60) = std::numeric_limits<float>::quiet_NaN();
  bad(12, 61) = -std::numeric_limits<float>::infinity();
  DeviceMatrix dbad = to_device(cuda, bad);
  const std::vector<ConstMatrixView> checks{devs[0].view(), dbad.view(),
                                            dbad.view().block(13, 0, 37, 70)};
  std::vector<std::optional<MatrixIndex>> found(checks.size());
  cuda.find_non_finite(checks, found);
  EXPECT_FALSE(found[0].has_value());
  ASSERT_TRUE(found[1].has_value());
  EXPECT_EQ(found[1]->row, 12);
  EXPECT_EQ(found[1]->col, 60);
  ASSERT_TRUE(found[2].has_value());
  EXPECT_EQ(found[2]->row, 20);
  EXPECT_EQ(found[2]->col, 5);
  const auto one = cuda.find_non_finite(dbad.view());
  const auto want = cpu.find_non_finite(bad.view());
  ASSERT_TRUE(one && want);
  EXPECT_EQ(one->row, want->row);
  EXPECT_EQ(one->col, want->col);
}

// Without a device the backend refuses to start with a clear error (this test skips nothing, so
// that a GPU machine runs it too: there it checks only the names).
TEST(CudaCompute, PrecisionNamesAndNoDeviceError) {
  if (cuda_device_count() == 0) {
    try {
      compute_backend("cuda");
      ADD_FAILURE() << "compute_backend(\"cuda\") without a device did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    }
    EXPECT_THROW(make_cuda_compute(), Error);
  }
  // DISTMUON_CUDA_PRECISION: an override, unset by default; the names are precision.h's.
  if (std::getenv("DISTMUON_CUDA_PRECISION") == nullptr) {
    EXPECT_FALSE(cuda_precision_override().has_value());
  }
  if (cuda_device_count() > 0) {
    EXPECT_EQ(make_cuda_compute()->default_precision(), Precision::kBf16);
    EXPECT_EQ(make_cuda_compute(Precision::kTf32)->default_precision(), Precision::kTf32);
  }
}

}  // namespace
}  // namespace distmuon
