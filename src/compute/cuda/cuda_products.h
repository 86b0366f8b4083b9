#pragma once
// The CUDA backend's reduced-precision products on cuBLAS (cuda_products.cpp): the symmetric
// product as a batched GEMM of the blocks on and above the diagonal, bf16 products with bf16
// output (one or a strided batch of equal shapes), and Newton-Schulz with bf16 storage
// (Compute::newton_schulz_bf16).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <limits>
#include <span>

#include "distmuon/compute.h"

namespace distmuon::cuda {

// A cuBLAS handle and the stream it runs on.
struct Blas {
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
};

// upper_triangle_product: blocks of at least this many rows, at most 8 x 8 of them; its pointer
// arrays are 3 * kMaxTriangleBlocks pointers of device memory.
constexpr Index kMinTriangleBlock = 1024;
constexpr int kMaxTriangleBlocks = 36;

// cuBLAS takes int dimensions: throws naming op when v exceeds them.
int blas_int(const char* op, Index v);

// c = alpha op(a) op(a)^T + beta c for a symmetric n x n c at a reduced precision: c is split into
// t x t blocks, the t (t + 1) / 2 on and above the diagonal are computed as one batched GEMM
// (10/16 of a full product's work for t = 4, 36/64 for t = 8), and the lower triangle is
// mirrored from the upper one. `a` holds op(a)'s operand of a_type (row-major, leading dimension
// lda), c is of c_type (fp32 or bf16, leading dimension ldc); t = 1 (a small or indivisible n) is
// one full product. `pointers`: device memory for 3 * kMaxTriangleBlocks pointers. `what` names
// the operation in errors.
void upper_triangle_product(const Blas& blas, void** pointers, const char* what, Trans ta, Index n,
                            Index k, float alpha, const void* a, cudaDataType a_type, Index lda,
                            float beta, void* c, cudaDataType c_type, Index ldc,
                            cublasComputeType_t ct);

// c_i = alpha op(a_i) op(b_i) + beta c_i for i < count: row-major bf16 operands and outputs
// (leading dimensions in elements), matrix i at element offset i * stride of each; fp32
// accumulation and epilogue, each output element rounded to bf16 once. count 1: cublasGemmEx,
// else cublasGemmStridedBatchedEx.
void bf16_product(const Blas& blas, const char* what, Trans ta, Trans tb, Index m, Index n, Index k,
                  float alpha, const void* a, Index lda, Index stride_a, const void* b, Index ldb,
                  Index stride_b, float beta, void* c, Index ldc, Index stride_c, int count);

// Compute::newton_schulz_bf16 on the GPU: X, X', A and B in bf16 in `scratch` (their arrays
// aligned to 16 bytes), every product writing bf16 with the polynomial's terms in its epilogue
// (B = c A A + b A with beta = b on a copy of A, X' = B X + a X with beta = a on a copy of X);
// one matrix: A and A A as upper_triangle_product when use_syrk; several: every product one
// strided-batched GEMM over them.
void newton_schulz_bf16(const Blas& blas, void** pointers, std::span<const MatrixView> xs,
                        bool rows, std::span<const NsStep> steps, bool use_syrk,
                        MatrixView scratch);

}  // namespace distmuon::cuda
