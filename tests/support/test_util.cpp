#include "test_util.h"

#include "distmuon/compute.h"
#include "distmuon/tp.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <stdexcept>

namespace distmuon::test {

Matrix random_matrix(Index rows, Index cols, std::uint64_t seed) {
  Matrix m(rows, cols);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist;
  for (float& x : m.values())
    x = static_cast<float>(dist(rng));
  return m;
}

template <typename T>
Matrix reference_newton_schulz(ConstMatrixView g, const CoefficientSet& coefficients, int steps,
                               double eps) {
  std::vector<T> values(static_cast<std::size_t>(g.rows * g.cols));
  for (Index i = 0; i < g.rows; ++i)
    for (Index j = 0; j < g.cols; ++j)
      values[static_cast<std::size_t>(i * g.cols + j)] = static_cast<T>(g(i, j));
  const std::vector<T> x =
      distmuon::reference_newton_schulz<T>(values, g.rows, g.cols, coefficients, steps, eps);
  Matrix out(g.rows, g.cols);
  for (std::size_t i = 0; i < x.size(); ++i)
    out.data()[i] = static_cast<float>(x[i]);
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
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return {std::istreambuf_iterator<char>(in), {}};
}

CommandRun run_command(const std::string& command, const std::filesystem::path& log) {
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(fmt::format("{} > '{}' 2>&1", command, log.string()).c_str());
  CommandRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  r.output = read_text(log);
  return r;
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

DistributedNs distributed_ns(const Matrix& full, int dim, const NsOptions& o,
                             const Communicator& group) {
  const int parts = group.size(), me = group.rank();
  const Matrix single = newton_schulz(full.view(), o, cpu_compute());
  Matrix mine = shard_of(full.view(), dim, parts, me);
  auto stats = std::make_shared<CommStats>();
  const Communicator counted = counting_communicator(group, stats);
  newton_schulz_inplace(mine.view(), o, cpu_compute(), &counted);
  return {relative_error(mine.view(), shard_of(single.view(), dim, parts, me).view()), *stats};
}

bool under_address_sanitizer() {
  return ::dlsym(RTLD_DEFAULT, "__asan_init") != nullptr;
}

}  // namespace distmuon::test
