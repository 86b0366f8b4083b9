// fp32 error of Gram Newton-Schulz against the standard iteration with the same coefficients:
// every built-in coefficient set, tall / wide / square inputs, Gaussian and ill-conditioned inputs
// (singular values log-spaced over 1e-6..1), without and with restarts. Prints the markdown table
// of docs/gram-newton-schulz.md:
//
//   gram_ns_error [steps]
//
// error = ||X_gram - X_standard||_F / ||X_standard||_F, both computed in fp32 by distmuon; the
// reference column is the same distance between the standard fp32 result and a float64 standard
// run (the floor fp32 itself sets).
#include <fmt/format.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <vector>

#include "distmuon/compute.h"
#include "distmuon/newton_schulz.h"

namespace {
using namespace distmuon;

// A random n x k matrix with orthonormal columns (QR of a Gaussian matrix, in double).
std::vector<double> random_orthonormal(int n, int k, std::mt19937_64& rng) {
  std::normal_distribution<double> d;
  std::vector<double> a(static_cast<std::size_t>(n) * k), tau(static_cast<std::size_t>(k));
  for (double& v : a)
    v = d(rng);
  if (LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, n, k, a.data(), k, tau.data()) != 0 ||
      LAPACKE_dorgqr(LAPACK_ROW_MAJOR, n, k, k, a.data(), k, tau.data()) != 0)
    throw std::runtime_error("LAPACK QR failed");
  return a;
}

// m x n with the given singular values (min(m, n) of them): U diag(s) V^T.
std::vector<double> with_singular_values(Index m, Index n, const std::vector<double>& s,
                                         std::mt19937_64& rng) {
  const int k = static_cast<int>(std::min(m, n));
  const std::vector<double> u = random_orthonormal(static_cast<int>(m), k, rng);
  const std::vector<double> v = random_orthonormal(static_cast<int>(n), k, rng);
  std::vector<double> x(static_cast<std::size_t>(m * n), 0.0);
  for (Index i = 0; i < m; ++i)
    for (Index j = 0; j < n; ++j) {
      double sum = 0;
      for (int r = 0; r < k; ++r)
        sum += u[static_cast<std::size_t>(i * k + r)] * s[static_cast<std::size_t>(r)] *
               v[static_cast<std::size_t>(j * k + r)];
      x[static_cast<std::size_t>(i * n + j)] = sum;
    }
  return x;
}

// The standard iteration in float64 (newton_schulz.h's reference), for the fp32 floor.
std::vector<double> standard_f64(const std::vector<double>& x, Index m, Index n,
                                 const NsOptions& o) {
  return reference_newton_schulz<double>(x, m, n, o.coefficients, o.steps, o.eps);
}

double rel_diff(const Matrix& a, const Matrix& b) {
  double num = 0, den = 0;
  for (Index i = 0; i < a.rows(); ++i)
    for (Index j = 0; j < a.cols(); ++j) {
      const double d = static_cast<double>(a(i, j)) - b(i, j);
      num += d * d;
      den += static_cast<double>(b(i, j)) * b(i, j);
    }
  return std::sqrt(num / den);
}

Matrix to_f32(const std::vector<double>& x, Index m, Index n) {
  Matrix out(m, n);
  for (Index i = 0; i < m; ++i)
    for (Index j = 0; j < n; ++j)
      out(i, j) = static_cast<float>(x[static_cast<std::size_t>(i * n + j)]);
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  // Steps per set: the argument, else each set's own schedule length (at least 5).
  const int steps = argc > 1 ? std::atoi(argv[1]) : 0;
  struct Shape {
    const char* name;
    Index m, n;
  };
  const Shape shapes[] = {
      {"tall 512x128", 512, 128}, {"wide 128x512", 128, 512}, {"square 256x256", 256, 256}};
  fmt::print(
      "| coefficients | shape | input | fp32 floor | gram, no restart | gram (automatic "
      "restarts) | gram, restart 2 |\n");
  fmt::print("|---|---|---|---|---|---|---|\n");
  double worst = 0, worst_restart = 0;
  for (const std::string& set : coefficient_set_names()) {
    if (set == "custom") continue;  // needs a user table
    NsOptions o;
    o.coefficients = coefficient_set(set);
    o.steps = steps > 0 ? steps : std::max(5, static_cast<int>(o.coefficients.table.size()));
    try {
      o.validate();
    } catch (const std::exception&) {
      o.steps = static_cast<int>(o.coefficients.table.size());  // fixed-length sets
    }
    for (const Shape& sh : shapes) {
      for (const bool ill : {false, true}) {
        std::mt19937_64 rng(static_cast<std::uint64_t>(sh.m * 7 + sh.n + (ill ? 1 : 0)));
        const Index k = std::min(sh.m, sh.n);
        std::vector<double> sv(static_cast<std::size_t>(k));
        std::normal_distribution<double> d;
        for (Index r = 0; r < k; ++r)  // 1e-6..1 log-spaced, or Gaussian-like spread
          sv[static_cast<std::size_t>(r)] =
              ill ? std::pow(10.0, -6.0 * static_cast<double>(r) / static_cast<double>(k - 1))
                  : 1.0 + 0.5 * std::abs(d(rng));
        const std::vector<double> x64 = with_singular_values(sh.m, sh.n, sv, rng);
        const Matrix x = to_f32(x64, sh.m, sh.n);
        Matrix standard = Matrix::from(x.view()), gram = Matrix::from(x.view()),
               restart = Matrix::from(x.view());
        newton_schulz_inplace(standard.view(), o, cpu_compute());
        NsOptions g = o;
        g.algorithm = NsAlgorithm::kGram;
        newton_schulz_inplace(gram.view(), g, cpu_compute());
        g.gram_restart = o.steps;  // a period of `steps`: never
        Matrix never = Matrix::from(x.view());
        newton_schulz_inplace(never.view(), g, cpu_compute());
        g.gram_restart = 2;
        newton_schulz_inplace(restart.view(), g, cpu_compute());
        const Matrix exact = to_f32(standard_f64(x64, sh.m, sh.n, o), sh.m, sh.n);
        const double e = rel_diff(gram, standard), er = rel_diff(restart, standard);
        worst = std::max(worst, e);
        worst_restart = std::max(worst_restart, er);
        NsOptions automatic = o;
        automatic.algorithm = NsAlgorithm::kGram;
        fmt::print("| {} ({} steps, {} Gram) | {} | {} | {:.1e} | {:.1e} | {:.1e} | {:.1e} |\n",
                   set, o.steps, gram_ns_gram_count(automatic), sh.name,
                   ill ? "s in 1e-6..1" : "well-conditioned", rel_diff(standard, exact),
                   rel_diff(never, standard), e, er);
      }
    }
  }
  fmt::print("\nworst: gram (automatic restarts) {:.2e}, gram with restart 2 {:.2e}\n", worst,
             worst_restart);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "gram_ns_error: {}\n", e.what());
  return 1;
}
