#pragma once
// bf16 products on the CPU: operands rounded to bf16 (round to nearest even, as the GPU's
// conversion and round_to), products summed in fp32, fp32 output, through oneDNN's matmul
// (AMX-bf16 or AVX512-BF16 kernels). The cpu backend uses them for Precision::kBf16 where
// oneDNN has such kernels for this CPU, and emulates bf16 with sgemm on rounded fp32 copies
// otherwise (docs/precision.md).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "distmuon/compute.h"

namespace distmuon::detail {

// A row-major bf16 matrix (leading dimension ld >= cols).
struct Bf16Matrix {
  const std::uint16_t* data = nullptr;
  Index rows = 0;
  Index cols = 0;
  Index ld = 0;
};

// out (a.rows x a.cols, contiguous) = a's elements rounded to bf16 as round_to(kBf16, v) rounds
// them (nearest even; a value past the largest bf16 becomes Inf), NaN stays NaN. Runs on up to
// `threads` threads.
void to_bf16(ConstMatrixView a, std::uint16_t* out, int threads);

// oneDNN's working memory for one product (the B operand repacked for its kernels): at least
// `bytes`, 64-byte aligned, owned by the caller and kept between products, so that a product
// allocates nothing once the buffer has grown.
using Bf16Scratchpad = std::function<void*(std::size_t bytes)>;

// row[0, cols) rounded to bf16 in place (round_to(kBf16, v) of each element; vectorised).
void round_row_to_bf16(float* row, Index cols);

// c = alpha op(a) op(b) + beta c (op(a) m x k, op(b) k x n), fp32 accumulation and output, on
// `threads` threads. beta = 0 overwrites c (NaN in c does not propagate).
void onednn_bf16_gemm(Trans ta, Trans tb, float alpha, Bf16Matrix a, Bf16Matrix b, float beta,
                      MatrixView c, const Bf16Scratchpad& scratchpad, int threads);

// The upper triangle (diagonal included) of c = alpha op(a) op(a)^T + beta c, n x n, c's lower
// triangle left as it was (the caller mirrors it). oneDNN has no syrk: at one thread c is split
// into row panels, each the product of its rows of op(a) with op(a)'s rows from the panel's first
// on (5/8 of a full product's work for 4 panels), computed into `work` (bf16_syrk_work(n, threads)
// floats) and copied into c; with more threads, or below order 512, one full product.
void onednn_bf16_syrk_upper(Trans ta, float alpha, Bf16Matrix a, float beta, MatrixView c,
                            float* work, const Bf16Scratchpad& scratchpad, int threads);
std::size_t bf16_syrk_work(Index n, int threads);

// Whether bf16 products run on oneDNN's kernels in this process: oneDNN has a bf16 matmul kernel
// for this CPU other than its reference code, and DISTMUON_CPU_BF16 is unset or "onednn"
// ("emulate" chooses the emulation). Probed once; throws on an invalid DISTMUON_CPU_BF16.
bool onednn_bf16_enabled();

// "oneDNN 2.6.3, brg:avx512_core_amx_bf16", or why bf16 is emulated.
std::string bf16_gemm_summary();

}  // namespace distmuon::detail
