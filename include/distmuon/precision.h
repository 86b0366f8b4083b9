#pragma once
// The arithmetic of a product (Compute::gemm and Compute::syrk): a property of each call, not of
// the backend, so that one backend serves optimizers of different precisions. Every precision
// accumulates in fp32 and stores fp32; they differ in how the operands are rounded before the
// multiply:
//  - kFp32: IEEE fp32 operands (cuBLAS CUBLAS_COMPUTE_32F; the CPU's sgemm).
//  - kTf32: operands rounded to TF32 (10 mantissa bits, round to nearest) on tensor cores (cuBLAS
//           CUBLAS_COMPUTE_32F_FAST_TF32).
//  - kBf16: operands rounded to bf16 (7 mantissa bits, round to nearest even) on tensor cores:
//           bf16 copies of the operands, cuBLAS's native bf16 GEMM.
// The CPU backends (cpu, opaque) emulate tf32 and bf16: operands rounded as the GPU rounds them,
// then sgemm on the rounded copies (docs/precision.md).

#include <optional>
#include <string_view>

namespace distmuon {

enum class Precision { kFp32, kTf32, kBf16 };

// "fp32", "tf32", "bf16"; parse throws distmuon::Error naming the value and listing the valid
// ones.
Precision parse_precision(std::string_view name);
const char* to_string(Precision precision);
// The names, in order of decreasing precision ("fp32, tf32, bf16"), for messages.
const char* precision_names();

// A float rounded to the precision's operand format, kept in a float: bf16 round to nearest even
// to 8 significant bits; tf32 round to nearest, ties away from zero, to 11 significant bits
// (PTX cvt.rna.tf32.f32); fp32 unchanged. Non-finite values are kept (a NaN stays a NaN).
float round_to(Precision precision, float v);

}  // namespace distmuon
