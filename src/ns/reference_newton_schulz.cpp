// Newton-Schulz by its definition, on the host (newton_schulz.h): the reference the tools and
// tests measure the backends' precisions against.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"

namespace distmuon {
namespace {

// c = a b for row-major a (m x k) and b (k x n).
template <typename T>
std::vector<T> matmul(const std::vector<T>& a, const std::vector<T>& b, Index m, Index k, Index n) {
  std::vector<T> c(static_cast<std::size_t>(m * n), T(0));
  for (Index i = 0; i < m; ++i)
    for (Index p = 0; p < k; ++p) {
      const T aip = a[static_cast<std::size_t>(i * k + p)];
      for (Index j = 0; j < n; ++j)
        c[static_cast<std::size_t>(i * n + j)] += aip * b[static_cast<std::size_t>(p * n + j)];
    }
  return c;
}

}  // namespace

template <typename T>
std::vector<T> reference_newton_schulz(std::span<const T> g, Index rows, Index cols,
                                       const CoefficientSet& coefficients, int steps, double eps) {
  if (rows < 0 || cols < 0 || g.size() != static_cast<std::size_t>(rows * cols)) {
    throw Error(fmt::format("reference_newton_schulz: {} values for a {} matrix", g.size(),
                            shape_str(rows, cols)));
  }
  const bool tall = rows > cols;
  const Index s = tall ? cols : rows, l = tall ? rows : cols;
  const auto at = [&](Index i, Index j) {  // (i, j) of g in the wide orientation's storage
    return static_cast<std::size_t>(tall ? j * l + i : i * l + j);
  };
  std::vector<T> x(g.size());
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j)
      x[at(i, j)] = g[static_cast<std::size_t>(i * cols + j)];
  T ss = 0;
  for (const T v : x)
    ss += v * v;
  const T norm = std::max<T>(std::sqrt(ss), static_cast<T>(eps));
  for (T& v : x)
    v /= norm;
  std::vector<T> xt(x.size());
  if (coefficients.input_scaling == CoefficientSet::InputScaling::kAol) {
    // AOL: row i of the wide X times 1 / sqrt(sum_j |(X X^T)_ij|) (a zero row stays zero).
    for (Index i = 0; i < s; ++i)
      for (Index j = 0; j < l; ++j)
        xt[static_cast<std::size_t>(j * s + i)] = x[static_cast<std::size_t>(i * l + j)];
    const std::vector<T> a = matmul(x, xt, s, l, s);
    for (Index i = 0; i < s; ++i) {
      T sum = 0;
      for (Index j = 0; j < s; ++j)
        sum += std::abs(a[static_cast<std::size_t>(i * s + j)]);
      if (sum == T(0)) continue;
      const T d = T(1) / std::sqrt(sum);
      for (Index j = 0; j < l; ++j)
        x[static_cast<std::size_t>(i * l + j)] *= d;
    }
  }
  for (int step = 0; step < steps; ++step) {
    const NsCoefficients& k = coefficients.at(step);
    for (Index i = 0; i < s; ++i)
      for (Index j = 0; j < l; ++j)
        xt[static_cast<std::size_t>(j * s + i)] = x[static_cast<std::size_t>(i * l + j)];
    const std::vector<T> a = matmul(x, xt, s, l, s);
    std::vector<T> b(a.size());
    if (k.c != 0.0) {
      const std::vector<T> aa = matmul(a, a, s, s, s);
      for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = static_cast<T>(k.b) * a[i] + static_cast<T>(k.c) * aa[i];
    } else {
      for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = static_cast<T>(k.b) * a[i];
    }
    const std::vector<T> bx = matmul(b, x, s, s, l);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<T>(k.a) * x[i] + bx[i];
  }
  std::vector<T> out(x.size());
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j)
      out[static_cast<std::size_t>(i * cols + j)] = x[at(i, j)];
  return out;
}

template std::vector<double> reference_newton_schulz<double>(std::span<const double>, Index, Index,
                                                             const CoefficientSet&, int, double);
template std::vector<float> reference_newton_schulz<float>(std::span<const float>, Index, Index,
                                                           const CoefficientSet&, int, double);

}  // namespace distmuon
