#pragma once
// How tp_mode=auto plans (MuonOptions::plan): by the cost model's estimate or by timing its
// leading candidates (measure_plan.h).

#include <string_view>

namespace distmuon {

// How tp_mode=auto plans: by the cost model's estimate (the default) or by timing its leading
// candidates.
enum class PlanMode { kEstimate, kMeasure };
PlanMode parse_plan_mode(std::string_view name);  // "estimate", "measure"; throws listing them
const char* to_string(PlanMode mode);

}  // namespace distmuon
