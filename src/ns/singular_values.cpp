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

}  // namespace distmuon
