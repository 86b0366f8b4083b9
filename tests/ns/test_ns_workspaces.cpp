// NS workspace reuse: NsWorkspaces hands out one workspace per (rows, cols, Gram side), a
// reused workspace is not reallocated, and results through a reused workspace (holding another
// call's leftovers) are bit-equal to a run with fresh scratch, for both algorithms.
#include <gtest/gtest.h>

#include "distmuon/newton_schulz.h"
#include "ns/ns_workspaces.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::random_matrix;

bool bit_equal(const Matrix& a, const Matrix& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  for (Index k = 0; k < a.size(); ++k)
    if (a.data()[k] != b.data()[k]) return false;
  return true;
}

TEST(NsWorkspaces, OnePerShapeAndSide) {
  detail::NsWorkspaces pool;
  NsWorkspace& a = pool.get(8, 16, GramSide::kAuto);
  EXPECT_EQ(&pool.get(8, 16, GramSide::kAuto), &a);
  EXPECT_NE(&pool.get(16, 8, GramSide::kAuto), &a);
  EXPECT_NE(&pool.get(8, 16, GramSide::kCols), &a);
  EXPECT_EQ(pool.size(), 3u);
}

TEST(NsWorkspaces, ReuseIsBitEqualAndDoesNotReallocate) {
  for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    NsOptions o;
    o.algorithm = algorithm;
    detail::NsWorkspaces pool;
    const Matrix g1 = random_matrix(24, 40, 11), g2 = random_matrix(24, 40, 12);
    const Matrix other = random_matrix(40, 24, 13);
    Matrix x1 = g1, x2 = g2, y = other;
    NsWorkspace& ws = pool.get(24, 40, GramSide::kAuto);
    newton_schulz_inplace(x1.view(), o, cpu_compute(), nullptr, &ws);
    const float* gram = ws.gram.view().data;
    const float* next = ws.next.view().data;
    newton_schulz_inplace(y.view(), o, cpu_compute(), nullptr, &pool.get(40, 24, GramSide::kAuto));
    newton_schulz_inplace(x2.view(), o, cpu_compute(), nullptr, &ws);  // leftovers of x1
    EXPECT_EQ(ws.gram.view().data, gram) << to_string(algorithm);
    EXPECT_EQ(ws.next.view().data, next) << to_string(algorithm);
    EXPECT_TRUE(bit_equal(x1, newton_schulz(g1.view(), o, cpu_compute()))) << to_string(algorithm);
    EXPECT_TRUE(bit_equal(x2, newton_schulz(g2.view(), o, cpu_compute()))) << to_string(algorithm);
    EXPECT_TRUE(bit_equal(y, newton_schulz(other.view(), o, cpu_compute())))
        << to_string(algorithm);
  }
}

}  // namespace
}  // namespace distmuon
