#pragma once
// The argument checks every compute backend runs before its arithmetic, so that a wrong shape
// is the same distmuon::Error on every backend.

#include <optional>
#include <span>

#include "distmuon/compute.h"

namespace distmuon::detail {

// op(a)'s rows and columns.
Index op_rows(ConstMatrixView a, Trans t);
Index op_cols(ConstMatrixView a, Trans t);
// Throws unless ld >= max(1, cols).
void check_ld(const char* op, const char* name, Index cols, Index ld);
// Throws unless x and y have the same shape.
void check_same(const char* op, const char* name, ConstMatrixView x, ConstMatrixView y);

// c = op(a) op(b): m x n with inner dimension k; throws on shapes that do not fit or a leading
// dimension below the columns.
struct GemmShape {
  Index m = 0, n = 0, k = 0;
};
GemmShape check_gemm(Trans ta, Trans tb, ConstMatrixView a, ConstMatrixView b, ConstMatrixView c);
// c = op(a) op(a)^T: n x n with inner dimension k; the same checks.
struct SyrkShape {
  Index n = 0, k = 0;
};
SyrkShape check_syrk(Trans ta, ConstMatrixView a, ConstMatrixView c);
// Compute::newton_schulz_bf16's arguments: every x of the first's shape, a contiguous scratch of
// at least ns_bf16_scratch_floats floats (defined in ns_bf16.cpp).
void check_ns_bf16_args(const char* op, std::span<const MatrixView> xs, bool rows,
                        MatrixView scratch);
// The batched products' arguments (Compute::gemm_batched, syrk_batched): as many a (b) as c,
// every matrix of a list in its first's shape, and that shape fitting (check_gemm, check_syrk).
void check_gemm_batched(Trans ta, Trans tb, std::span<const ConstMatrixView> a,
                        std::span<const ConstMatrixView> b, std::span<const MatrixView> c);
void check_syrk_batched(Trans ta, std::span<const ConstMatrixView> a,
                        std::span<const MatrixView> c);
// The element stride between consecutive matrices of a batch when every view has the first's
// leading dimension and starts that many floats after the one before (a batch cut from one
// buffer, e.g. a stacked parameter's slices); nullopt otherwise. 0 for a batch of one.
std::optional<Index> batch_stride(std::span<const ConstMatrixView> views);
// Compute::muon_directions's arguments: each direction's w, buf and u of its g's shape, its
// checked rows within them, one result per check (3 per direction and one per other) and two
// sums per direction that asks.
void check_muon_directions(std::span<const MuonDirection> dirs,
                           std::span<const ConstMatrixView> others,
                           std::span<const std::optional<MatrixIndex>> found,
                           std::span<const double> sums);

}  // namespace distmuon::detail
