#pragma once
// The names of WeightDecayMethod, ScaleMode and ParamRole (core/enum_names.h).

#include "core/enum_names.h"
#include "distmuon/muon.h"

namespace distmuon::detail {

template <>
inline constexpr auto kEnumNames<WeightDecayMethod> = std::array<EnumName<WeightDecayMethod>, 3>{{
    {WeightDecayMethod::kDecoupled, "decoupled"},
    {WeightDecayMethod::kIndependent, "independent"},
    {WeightDecayMethod::kL2, "l2"},
}};

template <>
inline constexpr auto kEnumNames<ScaleMode> = std::array<EnumName<ScaleMode>, 3>{{
    {ScaleMode::kSpectral, "spectral"},
    {ScaleMode::kShapeScaling, "shape_scaling"},
    {ScaleMode::kUnitRmsNorm, "unit_rms_norm"},
}};

template <>
inline constexpr auto kEnumNames<ReplicaMode> = std::array<EnumName<ReplicaMode>, 3>{{
    {ReplicaMode::kAuto, "auto"},
    {ReplicaMode::kHome, "home"},
    {ReplicaMode::kEveryRank, "every_rank"},
}};

template <>
inline constexpr auto kEnumNames<ReplicaWire> = std::array<EnumName<ReplicaWire>, 2>{{
    {ReplicaWire::kFp32, "fp32"},
    {ReplicaWire::kBf16, "bf16"},
}};

template <>
inline constexpr auto kEnumNames<MomentumDtype> = std::array<EnumName<MomentumDtype>, 2>{{
    {MomentumDtype::kFp32, "fp32"},
    {MomentumDtype::kParam, "param"},
}};

template <>
inline constexpr auto kEnumNames<ParamRole> = std::array<EnumName<ParamRole>, 4>{{
    {ParamRole::kHidden, "hidden"},
    {ParamRole::kEmbedding, "embedding"},
    {ParamRole::kOutputHead, "output_head"},
    {ParamRole::kOther, "other"},
}};

}  // namespace distmuon::detail
