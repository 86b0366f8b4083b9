#pragma once
// The names of CollectiveKind (core/enum_names.h).

#include "core/enum_names.h"
#include "distmuon/timing.h"

namespace distmuon::detail {

template <>
inline constexpr auto kEnumNames<CollectiveKind> = std::array<EnumName<CollectiveKind>, 2>{{
    {CollectiveKind::kAllGather, "all_gather"},
    {CollectiveKind::kAllReduce, "all_reduce"},
}};

}  // namespace distmuon::detail
