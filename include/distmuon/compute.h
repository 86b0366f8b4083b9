#pragma once
// The small compute interface that Newton-Schulz and the tensor-parallel orchestration are
// written against. The CPU backend (src/compute/cpu) maps it onto CBLAS; a CUDA backend maps the
// same calls onto cuBLAS without touching the algorithms.

#include <memory>
#include <string>

#include "distmuon/matrix.h"

namespace distmuon {

enum class Trans { kNo, kYes };

class Compute {
 public:
  virtual ~Compute() = default;
  virtual std::string name() const = 0;

  // c = alpha * op(a) * op(b) + beta * c.
  virtual void gemm(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b,
                    float beta, MatrixView c) = 0;
  // c = alpha * op(a) * op(a)^T + beta * c for a symmetric c; both triangles of c are written.
  virtual void syrk(Trans ta, float alpha, ConstMatrixView a, float beta, MatrixView c) = 0;
  // Sum of squares of all elements, accumulated in double (or in float when in_double is false).
  virtual double sum_squares(ConstMatrixView a, bool in_double) = 0;
  // a *= alpha.
  virtual void scale(MatrixView a, float alpha) = 0;
  // y = alpha * x + beta * y (same shapes).
  virtual void axpby(float alpha, ConstMatrixView x, float beta, MatrixView y) = 0;
  // a(i, i) += alpha for a square a.
  virtual void add_diagonal(MatrixView a, float alpha) = 0;
};

// The process-wide CPU (CBLAS) backend.
Compute& cpu_compute();

// BLAS threads per process. distmuon sets 1 on first use unless DISTMUON_BLAS_THREADS is set,
// since ranks share the cores.
void set_blas_threads(int threads);
int blas_threads();

}  // namespace distmuon
