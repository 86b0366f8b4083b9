#pragma once
// Singular values of a matrix, for diagnostics and tests: how orthogonal a Newton-Schulz result
// is (all singular values near 1).

#include <vector>

#include "distmuon/matrix.h"

namespace distmuon {

// Singular values of a (descending), computed in double through LAPACK (eigenvalues of the
// smaller Gram matrix). Throws distmuon::Error when LAPACK fails.
std::vector<double> singular_values(ConstMatrixView a);

// The signed alignment of x with the polar factor U V^T of g (g = U S V^T, both m x n): the
// cosine <U V^T, x> / (||U V^T||_F ||x||_F), in double. 1 for a perfect orthogonalisation of g,
// near -1 for a reversed one. Directions of g with a singular value below 1e-6 of its largest
// are left out of U V^T (its rank). Throws distmuon::Error on a shape mismatch or when LAPACK
// fails; 0 when g or x is zero.
double polar_alignment(ConstMatrixView g, ConstMatrixView x);

}  // namespace distmuon
