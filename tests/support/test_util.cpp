#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <random>

namespace distmuon::test {

Matrix random_matrix(Index rows, Index cols, std::uint64_t seed) {
  Matrix m(rows, cols);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist;
  for (float& x : m.values())
    x = static_cast<float>(dist(rng));
  return m;
}

namespace {
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
Matrix reference_newton_schulz(ConstMatrixView g, const CoefficientSet& coefficients, int steps,
                               double eps) {
  const bool tall = g.rows > g.cols;
  const Index s = tall ? g.cols : g.rows, l = tall ? g.rows : g.cols;
  std::vector<T> x(static_cast<std::size_t>(s * l));
  for (Index i = 0; i < g.rows; ++i)
    for (Index j = 0; j < g.cols; ++j)
      x[static_cast<std::size_t>(tall ? j * l + i : i * l + j)] = static_cast<T>(g(i, j));
  T ss = 0;
  for (T v : x)
    ss += v * v;
  const T norm = std::max<T>(std::sqrt(ss), static_cast<T>(eps));
  for (T& v : x)
    v /= norm;
  for (int step = 0; step < steps; ++step) {
    const auto& k = coefficients.at(step);
    std::vector<T> xt(x.size());
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
  Matrix out(g.rows, g.cols);
  for (Index i = 0; i < g.rows; ++i)
    for (Index j = 0; j < g.cols; ++j)
      out(i, j) = static_cast<float>(x[static_cast<std::size_t>(tall ? j * l + i : i * l + j)]);
  return out;
}

template Matrix reference_newton_schulz<double>(ConstMatrixView, const CoefficientSet&, int,
                                                double);
template Matrix reference_newton_schulz<float>(ConstMatrixView, const CoefficientSet&, int, double);

Matrix slice_rows(ConstMatrixView m, Index r0, Index n) {
  return Matrix::from(m.block(r0, 0, n, m.cols));
}
Matrix slice_cols(ConstMatrixView m, Index c0, Index n) {
  return Matrix::from(m.block(0, c0, m.rows, n));
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::map<std::string, std::string> files_of(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file())
      out[std::filesystem::relative(e.path(), dir).string()] = read_text(e.path());
  return out;
}

bool is_png_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  return in.gcount() == 8 && std::string(magic, 8) == "\x89PNG\r\n\x1a\n";
}

}  // namespace distmuon::test
