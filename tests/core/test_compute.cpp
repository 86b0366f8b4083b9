// The CPU compute backend against naive loops (exact small integers, so equality is exact).
#include <gtest/gtest.h>

#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

Matrix small_ints(Index r, Index c, int seed) {
  Matrix m(r, c);
  for (Index i = 0; i < m.size(); ++i)
    m.data()[i] = static_cast<float>((i * 7 + seed) % 5 - 2);
  return m;
}

TEST(CpuCompute, GemmAllTransposes) {
  const Matrix a = small_ints(3, 4, 1), b = small_ints(4, 5, 2);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Matrix aa = ta ? transpose(a.view()) : a;  // stored so that op(aa) == a
      const Matrix bb = tb ? transpose(b.view()) : b;
      Matrix c(3, 5);
      cpu_compute().gemm(ta ? Trans::kYes : Trans::kNo, tb ? Trans::kYes : Trans::kNo, 1.0f,
                         aa.view(), bb.view(), 0.0f, c.view());
      for (Index i = 0; i < 3; ++i)
        for (Index j = 0; j < 5; ++j) {
          float ref = 0;
          for (Index k = 0; k < 4; ++k)
            ref += a(i, k) * b(k, j);
          EXPECT_EQ(c(i, j), ref);
        }
    }
  }
  Matrix wrong(2, 5);
  EXPECT_THROW(cpu_compute().gemm(Trans::kNo, Trans::kNo, 1, a.view(), b.view(), 0, wrong.view()),
               Error);
}

TEST(CpuCompute, SyrkWritesBothTriangles) {
  for (Index n : {1, 5, 70, 130}) {  // 130 crosses the mirror's 64-wide tiles
    const Matrix a = small_ints(n, 9, 3);
    Matrix c(n, n), ct(9, 9);
    cpu_compute().syrk(Trans::kNo, 1.0f, a.view(), 0.0f, c.view());
    cpu_compute().syrk(Trans::kYes, 1.0f, a.view(), 0.0f, ct.view());
    for (Index i = 0; i < n; ++i)
      for (Index j = 0; j < n; ++j) {
        float ref = 0;
        for (Index k = 0; k < 9; ++k)
          ref += a(i, k) * a(j, k);
        ASSERT_EQ(c(i, j), ref) << n << " " << i << "," << j;
      }
    for (Index i = 0; i < 9; ++i)
      for (Index j = 0; j < 9; ++j) {
        float ref = 0;
        for (Index k = 0; k < n; ++k)
          ref += a(k, i) * a(k, j);
        ASSERT_EQ(ct(i, j), ref);
      }
  }
}

TEST(CpuCompute, ElementwiseOps) {
  Matrix y = small_ints(3, 3, 0);
  const Matrix x = small_ints(3, 3, 1);
  const Matrix y0 = y;
  cpu_compute().axpby(2.0f, x.view(), -1.0f, y.view());
  for (Index i = 0; i < 9; ++i)
    EXPECT_EQ(y.data()[i], 2 * x.data()[i] - y0.data()[i]);
  cpu_compute().add_diagonal(y.view(), 1.5f);
  EXPECT_EQ(y(1, 1), 2 * x(1, 1) - y0(1, 1) + 1.5f);
  EXPECT_DOUBLE_EQ(cpu_compute().sum_squares(x.view(), true),
                   cpu_compute().sum_squares(x.view(), false));
  Matrix rect(2, 3);
  EXPECT_THROW(cpu_compute().add_diagonal(rect.view(), 1.0f), Error);
}

TEST(CpuCompute, BlasThreadsConfigurable) {
  const int before = blas_threads();
  EXPECT_GE(before, 1);
  set_blas_threads(2);
  EXPECT_EQ(blas_threads(), 2);
  set_blas_threads(before);
  EXPECT_THROW(set_blas_threads(0), Error);
}

}  // namespace
}  // namespace distmuon
