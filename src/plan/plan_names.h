#pragma once
// The names of PlanMode and CostModel (core/enum_names.h).

#include "core/enum_names.h"
#include "distmuon/cost_model.h"
#include "distmuon/measure_plan.h"

namespace distmuon::detail {

template <>
inline constexpr auto kEnumNames<PlanMode> = std::array<EnumName<PlanMode>, 2>{{
    {PlanMode::kEstimate, "estimate"},
    {PlanMode::kMeasure, "measure"},
}};

template <>
inline constexpr auto kEnumNames<CostModel> = std::array<EnumName<CostModel>, 2>{{
    {CostModel::kRefined, "refined"},
    {CostModel::kReference, "reference"},
}};

}  // namespace distmuon::detail
