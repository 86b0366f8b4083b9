#include "distmuon/matrix.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "distmuon/error.h"

namespace distmuon {

namespace {
void check_block(Index rows, Index cols, Index r0, Index c0, Index nr, Index nc) {
  if (r0 < 0 || c0 < 0 || nr < 0 || nc < 0 || r0 + nr > rows || c0 + nc > cols) {
    throw Error(fmt::format("matrix block [{}:{}, {}:{}] is outside a {} matrix", r0, r0 + nr, c0,
                            c0 + nc, shape_str(rows, cols)));
  }
}
}  // namespace

ConstMatrixView ConstMatrixView::row_block(Index r0, Index n) const {
  return block(r0, 0, n, cols);
}
ConstMatrixView ConstMatrixView::block(Index r0, Index c0, Index nr, Index nc) const {
  check_block(rows, cols, r0, c0, nr, nc);
  return {data + r0 * ld + c0, nr, nc, ld};
}
MatrixView MatrixView::row_block(Index r0, Index n) const {
  return block(r0, 0, n, cols);
}
MatrixView MatrixView::block(Index r0, Index c0, Index nr, Index nc) const {
  check_block(rows, cols, r0, c0, nr, nc);
  return {data + r0 * ld + c0, nr, nc, ld};
}

Matrix::Matrix(Index rows, Index cols) : rows_(rows), cols_(cols) {
  if (rows < 0 || cols < 0)
    throw Error("matrix shape must be non-negative, got " + shape_str(rows, cols));
  data_.assign(static_cast<size_t>(rows * cols), 0.0f);
}

Matrix::Matrix(Index rows, Index cols, std::vector<float> values)
    : rows_(rows), cols_(cols), data_(std::move(values)) {
  if (rows < 0 || cols < 0 || static_cast<Index>(data_.size()) != rows * cols) {
    throw Error(fmt::format("matrix {} needs {} values, got {}", shape_str(rows, cols), rows * cols,
                            data_.size()));
  }
}

Matrix Matrix::from(ConstMatrixView v) {
  Matrix m(v.rows, v.cols);
  copy(v, m.view());
  return m;
}

void copy(ConstMatrixView src, MatrixView dst) {
  if (src.rows != dst.rows || src.cols != dst.cols) {
    throw Error(fmt::format("copy: shape mismatch {} -> {}", shape_str(src),
                            shape_str(dst.rows, dst.cols)));
  }
  if (src.size() == 0) return;
  if (src.contiguous() && dst.contiguous()) {
    std::memmove(dst.data, src.data, sizeof(float) * static_cast<size_t>(src.size()));
    return;
  }
  for (Index i = 0; i < src.rows; ++i) {
    std::memmove(dst.data + i * dst.ld, src.data + i * src.ld,
                 sizeof(float) * static_cast<size_t>(src.cols));
  }
}

Matrix transpose(ConstMatrixView a) {
  Matrix t(a.cols, a.rows);
  for (Index i = 0; i < a.rows; ++i)
    for (Index j = 0; j < a.cols; ++j)
      t(j, i) = a(i, j);
  return t;
}

std::string shape_str(Index rows, Index cols) {
  return fmt::format("{}x{}", rows, cols);
}

double relative_error(ConstMatrixView a, ConstMatrixView b) {
  if (a.rows != b.rows || a.cols != b.cols) {
    throw Error(fmt::format("relative_error: shape mismatch {} vs {}", shape_str(a), shape_str(b)));
  }
  double diff = 0.0, ref = 0.0;
  for (Index i = 0; i < a.rows; ++i) {
    for (Index j = 0; j < a.cols; ++j) {
      const double d = static_cast<double>(a(i, j)) - b(i, j);
      diff += d * d;
      ref += static_cast<double>(b(i, j)) * b(i, j);
    }
  }
  return ref > 0.0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

}  // namespace distmuon
