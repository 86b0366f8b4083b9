// The CUDA backend's reduced-precision products and bf16-storage Newton-Schulz (cuda_products.h).
// Row-major views map onto cuBLAS's column-major convention as their transposes:
// c = op(a) op(b) is c^T = op(b)^T op(a)^T.
#include "compute/cuda/cuda_products.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "compute/cuda/cuda_check.h"
#include "compute/cuda/cuda_kernels.h"
#include "compute/shape_checks.h"
#include "distmuon/error.h"

namespace distmuon::cuda {
namespace {

cublasOperation_t op_of(Trans t) {
  return t == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
}

// A bf16 element's size, and a bf16 array's length rounded up to 16 bytes (8 elements).
constexpr std::int64_t kBf16Bytes = 2;
Index aligned16(Index elements) {
  return (elements + 7) / 8 * 8;
}

}  // namespace

int blas_int(const char* op, Index v) {
  if (v > std::numeric_limits<int>::max()) {
    throw Error(fmt::format("{}: dimension {} exceeds cuBLAS's int range", op, v));
  }
  return static_cast<int>(v);
}

void upper_triangle_product(const Blas& blas, void** pointers, const char* what, Trans ta, Index n,
                            Index k, float alpha, const void* a, cudaDataType a_type, Index lda,
                            float beta, void* c, cudaDataType c_type, Index ldc,
                            cublasComputeType_t ct) {
  const auto context = [&] {
    return fmt::format("{}: op(a) {}, c {}", what, shape_str(n, k), shape_str(n, n));
  };
  int t = 1;
  for (const int blocks : {8, 4, 2}) {
    if (n % blocks == 0 && n / blocks >= kMinTriangleBlock) {
      t = blocks;
      break;
    }
  }
  const std::int64_t a_elem = a_type == CUDA_R_16BF ? kBf16Bytes : 4;
  const std::int64_t c_elem = c_type == CUDA_R_16BF ? kBf16Bytes : 4;
  const Index bs = n / t;
  const int count = t * (t + 1) / 2;
  const void** row_block = const_cast<const void**>(pointers);
  const void** col_block = row_block + kMaxTriangleBlocks;
  void** c_block = pointers + 2 * kMaxTriangleBlocks;
  // op(a)'s row block i starts i bs rows down a (not transposed) or i bs columns right
  // (transposed: op(a) = a^T).
  const std::int64_t a_step = (ta == Trans::kNo ? bs * lda : bs) * a_elem;
  check(upper_block_pointers(
            blas.stream, a, a_step, c, static_cast<std::int64_t>(bs * ldc) * c_elem,
            static_cast<std::int64_t>(bs) * c_elem, t, row_block, col_block, c_block),
        "upper_block_pointers kernel", context());
  // Block (i, j), row-major: c_ij = alpha op(a)_i op(a)_j^T + beta c_ij, which cuBLAS's
  // column-major convention computes as c_ij^T: the column block j is cuBLAS's A and the row
  // block i its B.
  const cublasOperation_t op_col = ta == Trans::kNo ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_row = ta == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
  const int bsi = blas_int(what, bs), ki = blas_int(what, k);
  const int ldi = blas_int(what, std::max<Index>(1, lda));
  check(cublas().gemm_batched_ex(blas.handle, op_col, op_row, bsi, bsi, ki, &alpha, col_block,
                                 a_type, ldi, row_block, a_type, ldi, &beta, c_block, c_type,
                                 blas_int(what, ldc), count, ct, CUBLAS_GEMM_DEFAULT),
        "cublasGemmBatchedEx", context());
  if (t == 1) return;
  if (c_type == CUDA_R_16BF) {
    check(mirror_upper_bf16(blas.stream, c, n, ldc), "mirror_upper kernel", context());
  } else {
    check(mirror_upper(blas.stream, Dev{static_cast<float*>(c), n, n, ldc}), "mirror_upper kernel",
          context());
  }
}

void bf16_product(const Blas& blas, const char* what, Trans ta, Trans tb, Index m, Index n, Index k,
                  float alpha, const void* a, Index lda, Index stride_a, const void* b, Index ldb,
                  Index stride_b, float beta, void* c, Index ldc, Index stride_c, int count) {
  const auto context = [&] {
    return fmt::format("{} (bf16): op(a) {} x op(b) {} into c {}{}", what, shape_str(m, k),
                       shape_str(k, n), shape_str(m, n),
                       count > 1 ? fmt::format(", {} matrices", count) : std::string());
  };
  const int mi = blas_int(what, m), ni = blas_int(what, n), ki = blas_int(what, k);
  const int ldai = blas_int(what, std::max<Index>(1, lda));
  const int ldbi = blas_int(what, std::max<Index>(1, ldb));
  const int ldci = blas_int(what, std::max<Index>(1, ldc));
  if (count == 1) {
    check(cublas().gemm_ex(blas.handle, op_of(tb), op_of(ta), ni, mi, ki, &alpha, b, CUDA_R_16BF,
                           ldbi, a, CUDA_R_16BF, ldai, &beta, c, CUDA_R_16BF, ldci,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx", context());
    return;
  }
  check(cublas().gemm_strided_batched_ex(blas.handle, op_of(tb), op_of(ta), ni, mi, ki, &alpha, b,
                                         CUDA_R_16BF, ldbi, stride_b, a, CUDA_R_16BF, ldai,
                                         stride_a, &beta, c, CUDA_R_16BF, ldci, stride_c, count,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx", context());
}

void newton_schulz_bf16(const Blas& blas, void** pointers, std::span<const MatrixView> xs,
                        bool rows, std::span<const NsStep> steps, bool use_syrk,
                        MatrixView scratch) {
  constexpr const char* kOp = "newton_schulz_bf16";
  detail::check_ns_bf16_args(kOp, xs, rows, scratch);
  if (xs.empty() || xs[0].size() == 0) return;
  const Index m = xs[0].rows, n = xs[0].cols;
  const Index s = rows ? m : n;
  const int count = blas_int(kOp, static_cast<Index>(xs.size()));
  // The bf16 arrays in the scratch, each matrix 16-byte aligned (ns_bf16_scratch_floats leaves
  // room): X and X' (count x m x n each), A and B (count x s x s each).
  const Index sx = aligned16(m * n), sa = aligned16(s * s);
  auto* base = reinterpret_cast<std::uint16_t*>(scratch.data);
  std::uint16_t* x = base;
  std::uint16_t* next = x + count * sx;
  std::uint16_t* a = next + count * sx;
  std::uint16_t* p = a + count * sa;
  const auto bytes = [](Index elements) { return static_cast<std::size_t>(elements) * kBf16Bytes; };
  const auto shape = [&] { return fmt::format("{}: {}", kOp, shape_str(m, n)); };
  for (int i = 0; i < count; ++i) {
    check(to_bf16(blas.stream, ConstDev{xs[i].data, m, n, xs[i].ld}, x + i * sx), "to_bf16 kernel",
          shape());
  }
  const bool triangle = use_syrk && count == 1;
  const Trans t = rows ? Trans::kNo : Trans::kYes;  // A = op(X) op(X)^T
  const Index l = rows ? n : m;
  for (const NsStep& k : steps) {
    // A = bf16(X X^T)
    if (triangle) {
      upper_triangle_product(blas, pointers, kOp, t, s, l, 1.0f, x, CUDA_R_16BF, n, 0.0f, a,
                             CUDA_R_16BF, s, CUBLAS_COMPUTE_32F);
    } else {
      bf16_product(blas, kOp, t, rows ? Trans::kYes : Trans::kNo, s, s, l, 1.0f, x, n, sx, x, n, sx,
                   0.0f, a, s, sa, count);
    }
    // B = bf16(c A A + b A), beta = b on a copy of A; c = 0: B = A and b is the next alpha.
    const std::uint16_t* b = a;
    float alpha = 1.0f;
    if (k.c != 0.0f) {
      check(cudaMemcpyAsync(p, a, bytes(count * sa), cudaMemcpyDeviceToDevice, blas.stream),
            "cudaMemcpyAsync", shape());
      if (triangle) {
        upper_triangle_product(blas, pointers, kOp, Trans::kNo, s, s, k.c, a, CUDA_R_16BF, s, k.b,
                               p, CUDA_R_16BF, s, CUBLAS_COMPUTE_32F);
      } else {
        bf16_product(blas, kOp, Trans::kNo, Trans::kNo, s, s, s, k.c, a, s, sa, a, s, sa, k.b, p, s,
                     sa, count);
      }
      b = p;
    } else {
      alpha = k.b;
    }
    // X' = bf16(alpha B X + a X), beta = a on a copy of X (X B on the column side).
    check(cudaMemcpyAsync(next, x, bytes(count * sx), cudaMemcpyDeviceToDevice, blas.stream),
          "cudaMemcpyAsync", shape());
    if (rows) {
      bf16_product(blas, kOp, Trans::kNo, Trans::kNo, m, n, m, alpha, b, s, sa, x, n, sx, k.a, next,
                   n, sx, count);
    } else {
      bf16_product(blas, kOp, Trans::kNo, Trans::kNo, m, n, n, alpha, x, n, sx, b, s, sa, k.a, next,
                   n, sx, count);
    }
    std::swap(x, next);
  }
  for (int i = 0; i < count; ++i) {
    check(from_bf16(blas.stream, x + i * sx, Dev{xs[i].data, m, n, xs[i].ld}), "from_bf16 kernel",
          shape());
  }
}

}  // namespace distmuon::cuda
