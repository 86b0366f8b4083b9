#pragma once
// The names of NsAlgorithm (core/enum_names.h).

#include "core/enum_names.h"
#include "distmuon/newton_schulz.h"

namespace distmuon::detail {

template <>
inline constexpr auto kEnumNames<NsAlgorithm> = std::array<EnumName<NsAlgorithm>, 3>{{
    {NsAlgorithm::kStandard, "standard"},
    {NsAlgorithm::kGram, "gram"},
    {NsAlgorithm::kAuto, "auto"},
}};

}  // namespace distmuon::detail
