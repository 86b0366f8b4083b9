#pragma once
// The names of ParamKind and Split (core/enum_names.h).

#include "core/enum_names.h"
#include "distmuon/charlm.h"
#include "distmuon/text_data.h"

namespace distmuon::detail {

template <>
inline constexpr auto kEnumNames<ParamKind> = std::array<EnumName<ParamKind>, 2>{{
    {ParamKind::kMuon, "muon"},
    {ParamKind::kAdamW, "adamw"},
}};

template <>
inline constexpr auto kEnumNames<Split> = std::array<EnumName<Split>, 2>{{
    {Split::kTrain, "train"},
    {Split::kValidation, "validation"},
}};

}  // namespace distmuon::detail
