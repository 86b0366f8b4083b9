#pragma once
// The names of Precision (core/enum_names.h).

#include "core/enum_names.h"
#include "distmuon/precision.h"

namespace distmuon::detail {

template <>
inline constexpr auto kEnumNames<Precision> = std::array<EnumName<Precision>, 3>{{
    {Precision::kFp32, "fp32"},
    {Precision::kTf32, "tf32"},
    {Precision::kBf16, "bf16"},
}};

}  // namespace distmuon::detail
