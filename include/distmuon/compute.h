#pragma once
// The small compute interface that Newton-Schulz and the tensor-parallel orchestration are
// written against. The CPU backend (src/compute/cpu) maps it onto CBLAS; a CUDA backend maps the
// same calls onto cuBLAS without touching the algorithms.

#include <memory>
#include <optional>
#include <string>

#include "distmuon/matrix.h"

namespace distmuon {

enum class Trans { kNo, kYes };

// An element's position in a matrix.
struct MatrixIndex {
  Index row = 0, col = 0;
};

// The per-element constants of one Muon momentum step (muon.h).
struct MomentumStep {
  float momentum = 0.0f;  // mu
  float l2 = 0.0f;        // L2 weight decay added to the gradient (0 for the other methods)
  bool nesterov = true;
};

// The per-element constants of one AdamW step at step t (adamw.h).
struct AdamWStep {
  float beta1 = 0.0f, beta2 = 0.0f;
  float bias1 = 1.0f;       // 1 - beta1^t
  float bias2_sqrt = 1.0f;  // sqrt(1 - beta2^t)
  float decay = 1.0f;       // 1 - lr wd
  float lr = 0.0f, eps = 0.0f;
};

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

  // Elementwise operations on matrices in the backend's memory; shapes must match (any leading
  // dimensions), else distmuon::Error.
  // a = value.
  virtual void fill(MatrixView a, float value) = 0;
  // dst = src.
  virtual void copy(ConstMatrixView src, MatrixView dst) = 0;
  // The first non-finite element of a in row-major order, or nothing when all are finite.
  virtual std::optional<MatrixIndex> find_non_finite(ConstMatrixView a) = 0;
  // Muon's momentum step, per element with mu = k.momentum:
  //   g' = g + k.l2 w;  buf = mu buf + (1 - mu) g';  u = nesterov ? (1 - mu) g' + mu buf : buf.
  virtual void muon_momentum(const MomentumStep& k, ConstMatrixView g, ConstMatrixView w,
                             MatrixView buf, MatrixView u) = 0;
  // AdamW's step, per element:
  //   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
  //   p = p decay - lr (m / bias1) / (sqrt(v) / bias2_sqrt + eps).
  virtual void adamw(const AdamWStep& k, ConstMatrixView g, MatrixView m, MatrixView v,
                     MatrixView p) = 0;
};

// The process-wide CPU (CBLAS) backend.
Compute& cpu_compute();

// BLAS threads per process. distmuon sets 1 on first use unless DISTMUON_BLAS_THREADS is set,
// since ranks share the cores.
void set_blas_threads(int threads);
int blas_threads();
// The BLAS kernel set in use (OpenBLAS's core name, e.g. "SkylakeX"; wisdom.h keys on it).
std::string blas_core_name();

}  // namespace distmuon
