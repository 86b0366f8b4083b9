#include "compute/shape_checks.h"

#include <fmt/format.h>

#include <algorithm>

#include "distmuon/error.h"

namespace distmuon::detail {

Index op_rows(ConstMatrixView a, Trans t) {
  return t == Trans::kYes ? a.cols : a.rows;
}

Index op_cols(ConstMatrixView a, Trans t) {
  return t == Trans::kYes ? a.rows : a.cols;
}

void check_ld(const char* op, const char* name, Index cols, Index ld) {
  if (ld < std::max<Index>(1, cols)) {
    throw Error(fmt::format("{}: leading dimension {} of {} is smaller than its {} columns", op, ld,
                            name, cols));
  }
}

void check_same(const char* op, const char* name, ConstMatrixView x, ConstMatrixView y) {
  if (x.rows != y.rows || x.cols != y.cols) {
    throw Error(fmt::format("{}: {} is {}, expected {}", op, name, shape_str(x), shape_str(y)));
  }
}

GemmShape check_gemm(Trans ta, Trans tb, ConstMatrixView a, ConstMatrixView b, ConstMatrixView c) {
  const GemmShape s{op_rows(a, ta), op_cols(b, tb), op_cols(a, ta)};
  if (op_rows(b, tb) != s.k || c.rows != s.m || c.cols != s.n) {
    throw Error(fmt::format("gemm: op(a) {} x op(b) {} does not fit c {}", shape_str(s.m, s.k),
                            shape_str(op_rows(b, tb), s.n), shape_str(c.rows, c.cols)));
  }
  check_ld("gemm", "a", a.cols, a.ld);
  check_ld("gemm", "b", b.cols, b.ld);
  check_ld("gemm", "c", c.cols, c.ld);
  return s;
}

SyrkShape check_syrk(Trans ta, ConstMatrixView a, ConstMatrixView c) {
  const SyrkShape s{op_rows(a, ta), op_cols(a, ta)};
  if (c.rows != s.n || c.cols != s.n) {
    throw Error(fmt::format("syrk: op(a) {} needs a {} output, got {}", shape_str(s.n, s.k),
                            shape_str(s.n, s.n), shape_str(c.rows, c.cols)));
  }
  check_ld("syrk", "a", a.cols, a.ld);
  check_ld("syrk", "c", c.cols, c.ld);
  return s;
}

void check_muon_directions(std::span<const MuonDirection> dirs,
                           std::span<const ConstMatrixView> others,
                           std::span<const std::optional<MatrixIndex>> found,
                           std::span<const double> sums) {
  std::size_t summed = 0;
  for (const MuonDirection& d : dirs) {
    check_same("muon_directions", "weight", d.w, d.g);
    check_same("muon_directions", "momentum", d.buf, d.g);
    check_same("muon_directions", "update", d.u, d.g);
    if (d.checked_rows < 0 || d.checked_rows > d.g.rows) {
      throw Error(fmt::format("muon_directions: {} checked rows of a {} matrix", d.checked_rows,
                              shape_str(d.g)));
    }
    if (d.sums) summed += 2;
  }
  if (found.size() != 3 * dirs.size() + others.size() || sums.size() != summed) {
    throw Error(fmt::format(
        "muon_directions: {} results and {} sums for {} directions ({} with sums) and {} others",
        found.size(), sums.size(), dirs.size(), summed / 2, others.size()));
  }
}

}  // namespace distmuon::detail
