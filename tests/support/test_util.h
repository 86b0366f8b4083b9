#pragma once
// Shared test helpers: the world communicator of the test process, random matrices and a
// float64 reference Newton-Schulz written straight from the definition (no BLAS).

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"

namespace distmuon::test {

// Whether this process runs under AddressSanitizer's runtime: the sanitized build links it into
// every program but instruments only the libraries, so no compile-time macro of the tests' code
// tells (docs/reliability.md).
bool under_address_sanitizer();

// MPI world when the test runs under mpirun, else the local communicator.
const Communicator& world();

// Gaussian N(0, 1) entries from a fixed seed (identical on every rank).
Matrix random_matrix(Index rows, Index cols, std::uint64_t seed);

// Row-major double matrix for references.
struct DMatrix {
  Index rows = 0, cols = 0;
  std::vector<double> v;
  double& operator()(Index i, Index j) { return v[static_cast<std::size_t>(i * cols + j)]; }
  double operator()(Index i, Index j) const { return v[static_cast<std::size_t>(i * cols + j)]; }
};

// distmuon::reference_newton_schulz<T> (newton_schulz.h) on a Matrix: Newton-Schulz by its
// definition, in T (double for the float64 reference, float for an independent fp32 one).
template <typename T>
Matrix reference_newton_schulz(ConstMatrixView g, const CoefficientSet& coefficients, int steps,
                               double eps = 1e-15);

// The bound of Newton-Schulz at a reduced precision (tf32, bf16) against the float64 reference
// on every shape family, standard or Gram (tests/ns/test_ns_precision.cpp says why): tf32 1e-2,
// bf16 8e-2, Gram twice that. The CPU emulation and the GPU are both held to it.
inline double reduced_precision_ns_bound(bool gram, Precision p) {
  const double standard = p == Precision::kTf32 ? 1e-2 : 8e-2;
  return gram ? 2 * standard : standard;
}

// Distributed NS over a group (newton_schulz_inplace with the group): this rank's shard of full
// (split along dim over the group) orthogonalised with o, against the shard of one process's NS
// of full; the relative error and the group's collectives (counted).
struct DistributedNs {
  double error = 0;
  CommStats stats;
};
DistributedNs distributed_ns(const Matrix& full, int dim, const NsOptions& o,
                             const Communicator& group);

// Rows [r0, r0 + n) / columns [c0, c0 + n) of m as a new matrix.
Matrix slice_rows(ConstMatrixView m, Index r0, Index n);
Matrix slice_cols(ConstMatrixView m, Index c0, Index n);

// A file's bytes ("" when it cannot be opened), and every regular file below dir by its relative
// path (to compare folders byte for byte).
std::string read_text(const std::filesystem::path& path);
std::map<std::string, std::string> files_of(const std::filesystem::path& dir);

// How a shell command ended: its exit status (128 when a signal ended it), its wall time and what
// it printed (stdout and stderr together).
struct CommandRun {
  int exit_code = -1;
  double seconds = 0;
  std::string output;
};
// Runs command through the shell with its stdout and stderr redirected into the file log.
CommandRun run_command(const std::string& command, const std::filesystem::path& log);

// True when the file starts with the PNG signature (plots drawn through gnuplot).
bool is_png_file(const std::filesystem::path& path);

}  // namespace distmuon::test
