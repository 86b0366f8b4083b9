#pragma once
// The CUDA backend's kernels (cuda_kernels.cu), launched on the backend's stream. Views are
// row-major with a leading dimension, as in Compute; every launcher returns the launch's
// cudaError_t (cudaGetLastError), which the caller checks. Empty views launch nothing.
#include <cuda_runtime.h>

#include <cstdint>

namespace distmuon::cuda {

// A row-major rows x cols view with leading dimension ld (elements), in device memory.
struct Dev {
  float* data;
  std::int64_t rows, cols, ld;
};
struct ConstDev {
  const float* data;
  std::int64_t rows, cols, ld;
};

// The constants of Compute::muon_momentum and Compute::adamw (compute.h), as plain values.
struct MomentumArgs {
  float momentum, l2;
  bool nesterov;
};
struct AdamWArgs {
  float beta1, beta2, bias1, bias2_sqrt, decay, lr, eps;
};

// a *= alpha (alpha == 0 writes zeros, clearing NaN and Inf as BLAS beta = 0 does).
cudaError_t scale(cudaStream_t s, Dev a, float alpha);
// y = alpha x + beta y (beta == 0 ignores y).
cudaError_t axpby(cudaStream_t s, float alpha, ConstDev x, float beta, Dev y);
// Newton-Schulz's normalisation from a sum of squares in device memory (*sum): a *= the host's
// factor float(1 / max(sqrt(*sum), eps)), evaluated in double and cast as the host does, or
// a = NaN in every element when *sum is not finite.
cudaError_t scale_by_norm(cudaStream_t s, Dev a, const double* sum, double eps);
// a(i, i) += alpha.
cudaError_t add_diagonal(cudaStream_t s, Dev a, float alpha);
// p = (b * gram + p) + a on the diagonal (Compute::ns_polynomial), one pass.
cudaError_t ns_polynomial(cudaStream_t s, float a, float b, ConstDev gram, Dev p);
// a rounded to bf16 (bf16) or tf32 in place, kept in fp32 (round_to in precision.h).
cudaError_t round(cudaStream_t s, Dev a, bool bf16);
cudaError_t fill(cudaStream_t s, Dev a, float value);
// Copies the upper triangle of a square matrix into its lower one (syrk writes one triangle).
cudaError_t mirror_upper(cudaStream_t s, Dev c);
// The operand and result pointers of the t (t + 1) / 2 blocks on and above the diagonal of a
// product split into t x t blocks, in row-major block order (0,0), (0,1), ..., (t-1,t-1), for a
// batched GEMM: row_block[p] = a + i * a_step, col_block[p] = a + j * a_step and
// c_block[p] = c + i * c_row_step + j * c_col_step (steps in bytes) for block p = (i, j).
cudaError_t upper_block_pointers(cudaStream_t s, const void* a, std::int64_t a_step, void* c,
                                 std::int64_t c_row_step, std::int64_t c_col_step, int t,
                                 const void** row_block, const void** col_block, void** c_block);
cudaError_t muon_momentum(cudaStream_t s, MomentumArgs k, ConstDev g, ConstDev w, Dev buf, Dev u);
cudaError_t adamw(cudaStream_t s, AdamWArgs k, ConstDev g, Dev m, Dev v, Dev p);
// dst (rows * cols bf16 values, row-major, contiguous) = a rounded to bf16 (to nearest even).
cudaError_t to_bf16(cudaStream_t s, ConstDev a, void* dst);
// a = src (rows * cols bf16 values, row-major, contiguous) widened to fp32 (exact).
cudaError_t from_bf16(cudaStream_t s, const void* src, Dev a);
// mirror_upper for an n x n bf16 matrix with leading dimension ld (elements).
cudaError_t mirror_upper_bf16(cudaStream_t s, void* c, std::int64_t n, std::int64_t ld);
// *out += the sum of squares of a (out in device memory, zeroed by the caller): accumulated in
// double per thread when in_double, else in float per thread and block (the blocks' partial
// sums are added in double).
cudaError_t sum_squares(cudaStream_t s, ConstDev a, bool in_double, double* out);
// *out = min(*out, the row-major index i * cols + j of a's first non-finite element); the caller
// sets *out to UINT64_MAX first.
cudaError_t find_non_finite(cudaStream_t s, ConstDev a, unsigned long long* out);

}  // namespace distmuon::cuda
