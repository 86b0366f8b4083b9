#pragma once
// Row-major float32 matrices: an owning Matrix and non-owning views with a leading dimension.
// Element (i, j) lives at data[i * ld + j]; ld >= cols. Views never allocate.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace distmuon {

using Index = std::int64_t;

struct ConstMatrixView {
  const float* data = nullptr;
  Index rows = 0;
  Index cols = 0;
  Index ld = 0;

  const float& operator()(Index i, Index j) const { return data[i * ld + j]; }
  Index size() const { return rows * cols; }
  bool contiguous() const { return ld == cols || rows <= 1; }
  // Rows [r0, r0 + n) as a view of the same memory.
  ConstMatrixView row_block(Index r0, Index n) const;
  // Sub-block [r0, r0 + nr) x [c0, c0 + nc).
  ConstMatrixView block(Index r0, Index c0, Index nr, Index nc) const;
};

struct MatrixView {
  float* data = nullptr;
  Index rows = 0;
  Index cols = 0;
  Index ld = 0;

  float& operator()(Index i, Index j) const { return data[i * ld + j]; }
  Index size() const { return rows * cols; }
  bool contiguous() const { return ld == cols || rows <= 1; }
  operator ConstMatrixView() const { return {data, rows, cols, ld}; }
  MatrixView row_block(Index r0, Index n) const;
  MatrixView block(Index r0, Index c0, Index nr, Index nc) const;
};

// Owning, contiguous (ld == cols) row-major matrix. Zero-initialised.
class Matrix {
 public:
  Matrix() = default;
  Matrix(Index rows, Index cols);
  Matrix(Index rows, Index cols, std::vector<float> values);  // values.size() == rows * cols
  static Matrix from(ConstMatrixView v);                      // deep copy of a (strided) view

  Index rows() const { return rows_; }
  Index cols() const { return cols_; }
  Index size() const { return rows_ * cols_; }
  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::span<float> values() { return data_; }
  std::span<const float> values() const { return data_; }
  float& operator()(Index i, Index j) { return data_[i * cols_ + j]; }
  const float& operator()(Index i, Index j) const { return data_[i * cols_ + j]; }

  MatrixView view() { return {data_.data(), rows_, cols_, cols_}; }
  ConstMatrixView view() const { return {data_.data(), rows_, cols_, cols_}; }
  operator MatrixView() { return view(); }
  operator ConstMatrixView() const { return view(); }

 private:
  Index rows_ = 0;
  Index cols_ = 0;
  std::vector<float> data_;
};

// Copies src into dst (same shape, any leading dimensions).
void copy(ConstMatrixView src, MatrixView dst);
// The transpose as a new matrix.
Matrix transpose(ConstMatrixView a);
// "MxN", for messages.
std::string shape_str(Index rows, Index cols);
inline std::string shape_str(ConstMatrixView v) {
  return shape_str(v.rows, v.cols);
}

// Frobenius norm of a - b divided by the Frobenius norm of b (or of a - b when b is zero).
double relative_error(ConstMatrixView a, ConstMatrixView b);

}  // namespace distmuon
