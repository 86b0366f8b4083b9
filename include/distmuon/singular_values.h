#pragma once
// Singular values of a matrix, for diagnostics and tests: how orthogonal a Newton-Schulz result
// is (all singular values near 1).

#include <vector>

#include "distmuon/matrix.h"

namespace distmuon {

// Singular values of a (descending), computed in double through LAPACK (eigenvalues of the
// smaller Gram matrix). Throws distmuon::Error when LAPACK fails.
std::vector<double> singular_values(ConstMatrixView a);

}  // namespace distmuon
