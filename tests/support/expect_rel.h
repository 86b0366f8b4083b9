#pragma once
// Relative comparison for exact formulas (the cost model's breakdowns): equal to 1e-12 of the
// expected value, the rounding of a few double operations.

#include <gtest/gtest.h>

#include <cmath>

namespace distmuon::test {

inline void expect_rel(double actual, double expected) {
  EXPECT_NEAR(actual, expected, 1e-12 * std::abs(expected));
}

}  // namespace distmuon::test
