// Compute::newton_schulz_bf16's default (compute.h): the CUDA backend's bf16-storage iteration
// (src/compute/cuda/cuda_ns_bf16.cpp) as products at Precision::kBf16 with fp32 output, each
// rounded to bf16 after its epilogue (alpha * product + beta * C in fp32), so that the CPU and
// opaque backends, and with them the bounds of docs/precision.md measured on the CPU, follow the
// GPU's rounding order: operands that are bf16 values, fp32 accumulation, one rounding per
// output element.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "compute/shape_checks.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {

Index ns_bf16_scratch_floats(Index count, Index rows, Index cols, bool gram_of_rows) {
  const Index s = gram_of_rows ? rows : cols;
  // 2 s^2 + rows cols per matrix (the emulation's fp32 A, B and next X; the GPU's bf16 X, X', A
  // and B take half of it), and room to align the GPU's bf16 matrices to 16 bytes each.
  return count * (2 * s * s + rows * cols + 16) + 32;
}

namespace detail {
void check_ns_bf16_args(const char* op, std::span<const MatrixView> xs, bool rows,
                        MatrixView scratch) {
  if (xs.empty()) return;
  for (const MatrixView& x : xs) {
    if (x.rows != xs[0].rows || x.cols != xs[0].cols) {
      throw Error(fmt::format("{}: every matrix must have the shape of the first, {}; got {}", op,
                              shape_str(xs[0].rows, xs[0].cols), shape_str(x.rows, x.cols)));
    }
  }
  const Index need =
      ns_bf16_scratch_floats(static_cast<Index>(xs.size()), xs[0].rows, xs[0].cols, rows);
  if (!scratch.contiguous() || scratch.size() < need) {
    throw Error(fmt::format("{}: the scratch ({}) must be contiguous with at least {} floats", op,
                            shape_str(scratch.rows, scratch.cols), need));
  }
}
}  // namespace detail

void Compute::newton_schulz_bf16(std::span<const MatrixView> xs, bool rows,
                                 std::span<const NsStep> steps, bool use_syrk, MatrixView scratch) {
  detail::check_ns_bf16_args("newton_schulz_bf16", xs, rows, scratch);
  constexpr Precision kBf16 = Precision::kBf16;
  for (const MatrixView& x : xs) {
    if (x.size() == 0) continue;
    const Index s = rows ? x.rows : x.cols;
    MatrixView gram{scratch.data, s, s, s};
    MatrixView poly{scratch.data + s * s, s, s, s};
    MatrixView next{scratch.data + 2 * s * s, x.rows, x.cols, x.cols};
    round(x, kBf16);  // X = bf16(x), once
    MatrixView cur = x;
    MatrixView nxt = next;
    const Trans t = rows ? Trans::kNo : Trans::kYes;
    for (const NsStep& k : steps) {
      // A = bf16(X X^T)
      if (use_syrk) {
        syrk(t, 1.0f, cur, 0.0f, gram, kBf16);
      } else {
        gemm(t, rows ? Trans::kYes : Trans::kNo, 1.0f, cur, cur, 0.0f, gram, kBf16);
      }
      round(gram, kBf16);
      // B = bf16(c A A + b A): the product's epilogue with beta = b on a copy of A.
      ConstMatrixView b = gram;
      float scale_b = 1.0f;
      if (k.c != 0.0f) {
        copy(gram, poly);
        if (use_syrk) {
          syrk(Trans::kNo, k.c, gram, k.b, poly, kBf16);  // A symmetric: A A^T = A A
        } else {
          gemm(Trans::kNo, Trans::kNo, k.c, gram, gram, k.b, poly, kBf16);
        }
        round(poly, kBf16);
        b = poly;
      } else {
        scale_b = k.b;  // B X = b (A X): b is the product's alpha
      }
      // X' = bf16(scale_b B X + a X): the product's epilogue with beta = a on a copy of X.
      copy(cur, nxt);
      if (rows) {
        gemm(Trans::kNo, Trans::kNo, scale_b, b, cur, k.a, nxt, kBf16);
      } else {
        gemm(Trans::kNo, Trans::kNo, scale_b, cur, b, k.a, nxt, kBf16);
      }
      round(nxt, kBf16);
      std::swap(cur, nxt);
    }
    if (cur.data != x.data) copy(cur, x);
  }
}

}  // namespace distmuon
