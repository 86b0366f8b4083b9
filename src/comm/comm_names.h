#pragma once
// The names of DType and ReduceOp (core/enum_names.h).

#include "core/enum_names.h"
#include "distmuon/comm.h"

namespace distmuon::detail {

template <>
inline constexpr auto kEnumNames<DType> = std::array<EnumName<DType>, 7>{{
    {DType::kF32, "f32"},
    {DType::kF64, "f64"},
    {DType::kI32, "i32"},
    {DType::kI64, "i64"},
    {DType::kU8, "u8"},
    {DType::kBf16, "bf16"},
    {DType::kF16, "f16"},
}};

template <>
inline constexpr auto kEnumNames<ReduceOp> = std::array<EnumName<ReduceOp>, 3>{{
    {ReduceOp::kSum, "sum"},
    {ReduceOp::kMax, "max"},
    {ReduceOp::kMin, "min"},
}};

}  // namespace distmuon::detail
