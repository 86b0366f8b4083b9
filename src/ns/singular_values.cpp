#include <cblas.h>
#include <fmt/format.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>

#include "distmuon/error.h"
#include "distmuon/singular_values.h"

namespace distmuon {

std::vector<double> singular_values(ConstMatrixView a) {
  const bool rows_side = a.rows <= a.cols;
  const Index s = rows_side ? a.rows : a.cols;
  const Index l = rows_side ? a.cols : a.rows;
  if (s == 0) return {};
  std::vector<double> x(static_cast<std::size_t>(a.size()));
  for (Index i = 0; i < a.rows; ++i)
    for (Index j = 0; j < a.cols; ++j)
      x[static_cast<std::size_t>(i * a.cols + j)] = a(i, j);
  std::vector<double> g(static_cast<std::size_t>(s * s));
  cblas_dsyrk(CblasRowMajor, CblasUpper, rows_side ? CblasNoTrans : CblasTrans,
              static_cast<blasint>(s), static_cast<blasint>(l), 1.0, x.data(),
              static_cast<blasint>(a.cols), 0.0, g.data(), static_cast<blasint>(s));
  std::vector<double> w(static_cast<std::size_t>(s));
  const lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'N', 'U', static_cast<lapack_int>(s),
                                         g.data(), static_cast<lapack_int>(s), w.data());
  if (info != 0)
    throw Error(fmt::format("singular_values: LAPACK dsyevd on a {} Gram matrix returned {}",
                            shape_str(s, s), info));
  for (double& v : w)
    v = std::sqrt(std::max(v, 0.0));
  std::sort(w.begin(), w.end(), std::greater<>());
  return w;
}

double polar_alignment(ConstMatrixView g, ConstMatrixView x) {
  if (g.rows != x.rows || g.cols != x.cols) {
    throw Error(fmt::format("polar_alignment: input {} and result {} differ in shape", shape_str(g),
                            shape_str(x)));
  }
  // Wide (s = rows): U V^T = A^{-1/2} g with A = g g^T, so <U V^T, x> = <A^{-1/2}, x g^T>
  // = sum_k lambda_k^{-1/2} w_k^T (x g^T) w_k over the eigenpairs of A. Tall: the transposes.
  const bool rows_side = g.rows <= g.cols;
  const Index s = rows_side ? g.rows : g.cols;
  const Index l = rows_side ? g.cols : g.rows;
  if (s == 0) return 0.0;
  auto to_double = [](ConstMatrixView a) {
    std::vector<double> v(static_cast<std::size_t>(a.size()));
    for (Index i = 0; i < a.rows; ++i)
      for (Index j = 0; j < a.cols; ++j)
        v[static_cast<std::size_t>(i * a.cols + j)] = a(i, j);
    return v;
  };
  const std::vector<double> gd = to_double(g), xd = to_double(x);
  const auto n = static_cast<blasint>(s), k = static_cast<blasint>(l),
             ld = static_cast<blasint>(g.cols);
  const CBLAS_TRANSPOSE t = rows_side ? CblasNoTrans : CblasTrans;
  const CBLAS_TRANSPOSE tt = rows_side ? CblasTrans : CblasNoTrans;
  std::vector<double> a(static_cast<std::size_t>(s * s)), c(a.size()), m(a.size());
  cblas_dsyrk(CblasRowMajor, CblasUpper, t, n, k, 1.0, gd.data(), ld, 0.0, a.data(), n);
  cblas_dgemm(CblasRowMajor, t, tt, n, n, k, 1.0, xd.data(), ld, gd.data(), ld, 0.0, c.data(), n);
  std::vector<double> lambda(static_cast<std::size_t>(s));
  const lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', n, a.data(), n, lambda.data());
  if (info != 0) {
    throw Error(fmt::format("polar_alignment: LAPACK dsyevd on a {} Gram matrix returned {}",
                            shape_str(s, s), info));
  }
  // a now holds the eigenvectors as columns: m = c w.
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, c.data(), n, a.data(), n,
              0.0, m.data(), n);
  const double top = *std::max_element(lambda.begin(), lambda.end());
  double inner = 0, rank = 0, xx = 0;
  for (Index j = 0; j < s; ++j) {
    const double lj = lambda[static_cast<std::size_t>(j)];
    if (!(top > 0) || lj <= top * 1e-12) continue;  // sigma below 1e-6 of the largest
    double d = 0;
    for (Index i = 0; i < s; ++i)
      d += a[static_cast<std::size_t>(i * s + j)] * m[static_cast<std::size_t>(i * s + j)];
    inner += d / std::sqrt(lj);
    rank += 1;
  }
  for (double v : xd)
    xx += v * v;
  if (rank == 0 || !(xx > 0)) return 0.0;
  return inner / (std::sqrt(rank) * std::sqrt(xx));
}

}  // namespace distmuon
