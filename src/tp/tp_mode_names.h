#pragma once
// The names of TpMode (core/enum_names.h).

#include "core/enum_names.h"
#include "distmuon/tp_mode.h"

namespace distmuon::detail {

template <>
inline constexpr auto kEnumNames<TpMode> = std::array<EnumName<TpMode>, 5>{{
    {TpMode::kBlockwise, "blockwise"},
    {TpMode::kDuplicated, "duplicated"},
    {TpMode::kDistributed, "distributed"},
    {TpMode::kOwner, "owner"},
    {TpMode::kAuto, "auto"},
}};

}  // namespace distmuon::detail
