#include <gtest/gtest.h>

#include "distmuon/error.h"
#include "distmuon/matrix.h"

namespace distmuon {
namespace {

Matrix iota(Index r, Index c) {
  Matrix m(r, c);
  for (Index i = 0; i < m.size(); ++i)
    m.data()[i] = static_cast<float>(i);
  return m;
}

TEST(Matrix, ViewsAddressRowMajorWithLeadingDimension) {
  Matrix m = iota(4, 5);
  const MatrixView b = m.view().block(1, 2, 2, 3);
  EXPECT_EQ(b.ld, 5);
  EXPECT_EQ(b(0, 0), 7.0f);
  EXPECT_EQ(b(1, 2), 14.0f);
  EXPECT_FALSE(b.contiguous());
  EXPECT_TRUE(m.view().row_block(1, 2).contiguous());
  EXPECT_THROW(m.view().block(3, 0, 2, 1), Error);
  EXPECT_THROW(m.view().block(0, 4, 1, 2), Error);
}

TEST(Matrix, CopyTransposeAndErrors) {
  const Matrix m = iota(3, 4);
  const Matrix t = transpose(m.view());
  ASSERT_EQ(t.rows(), 4);
  for (Index i = 0; i < 3; ++i)
    for (Index j = 0; j < 4; ++j)
      EXPECT_EQ(t(j, i), m(i, j));
  Matrix dst(2, 2);
  copy(m.view().block(1, 1, 2, 2), dst.view());
  EXPECT_EQ(dst(1, 1), m(2, 2));
  EXPECT_THROW(copy(m.view(), dst.view()), Error);
  EXPECT_THROW(Matrix(2, 2, std::vector<float>(3)), Error);
  EXPECT_THROW(Matrix(-1, 2), Error);
  Matrix other = m;
  other(0, 1) += 1.0f;
  EXPECT_GT(relative_error(other.view(), m.view()), 0.0);
  EXPECT_EQ(relative_error(m.view(), m.view()), 0.0);
}

}  // namespace
}  // namespace distmuon
