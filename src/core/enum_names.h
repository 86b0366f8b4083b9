#pragma once
// The names of distmuon's enums, one table each, and the look-ups every parse_* and to_string
// is written with: name_of(value), parse_enum<E>(text, what) and enum_name_list<E>().
//
// A table lists every value once, in the order error messages list the names. To name a new
// enum, add a specialisation of kEnumNames below (test_enum_names checks every table).

#include <fmt/format.h>

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "distmuon/charlm.h"
#include "distmuon/comm.h"
#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/measure_plan.h"
#include "distmuon/muon.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/precision.h"
#include "distmuon/text_data.h"
#include "distmuon/timing.h"
#include "distmuon/tp_mode.h"

namespace distmuon::detail {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The table of enum E; only the specialisations exist.
template <typename E>
inline constexpr auto kEnumNames = nullptr;

template <>
inline constexpr auto kEnumNames<TpMode> = std::array<EnumName<TpMode>, 5>{{
    {TpMode::kBlockwise, "blockwise"},
    {TpMode::kDuplicated, "duplicated"},
    {TpMode::kDistributed, "distributed"},
    {TpMode::kOwner, "owner"},
    {TpMode::kAuto, "auto"},
}};

template <>
inline constexpr auto kEnumNames<NsAlgorithm> = std::array<EnumName<NsAlgorithm>, 3>{{
    {NsAlgorithm::kStandard, "standard"},
    {NsAlgorithm::kGram, "gram"},
    {NsAlgorithm::kAuto, "auto"},
}};

template <>
inline constexpr auto kEnumNames<Precision> = std::array<EnumName<Precision>, 3>{{
    {Precision::kFp32, "fp32"},
    {Precision::kTf32, "tf32"},
    {Precision::kBf16, "bf16"},
}};

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
inline constexpr auto kEnumNames<ParamRole> = std::array<EnumName<ParamRole>, 4>{{
    {ParamRole::kHidden, "hidden"},
    {ParamRole::kEmbedding, "embedding"},
    {ParamRole::kOutputHead, "output_head"},
    {ParamRole::kOther, "other"},
}};

template <>
inline constexpr auto kEnumNames<ParamKind> = std::array<EnumName<ParamKind>, 2>{{
    {ParamKind::kMuon, "muon"},
    {ParamKind::kAdamW, "adamw"},
}};

template <>
inline constexpr auto kEnumNames<CollectiveKind> = std::array<EnumName<CollectiveKind>, 2>{{
    {CollectiveKind::kAllGather, "all_gather"},
    {CollectiveKind::kAllReduce, "all_reduce"},
}};

template <>
inline constexpr auto kEnumNames<Split> = std::array<EnumName<Split>, 2>{{
    {Split::kTrain, "train"},
    {Split::kValidation, "validation"},
}};

template <>
inline constexpr auto kEnumNames<DType> = std::array<EnumName<DType>, 5>{{
    {DType::kF32, "f32"},
    {DType::kF64, "f64"},
    {DType::kI32, "i32"},
    {DType::kI64, "i64"},
    {DType::kU8, "u8"},
}};

template <>
inline constexpr auto kEnumNames<ReduceOp> = std::array<EnumName<ReduceOp>, 3>{{
    {ReduceOp::kSum, "sum"},
    {ReduceOp::kMax, "max"},
    {ReduceOp::kMin, "min"},
}};

// The name of `value`; "?" for a value outside the table (a cast from a corrupt integer).
template <typename E>
constexpr const char* name_of(E value) {
  for (const auto& e : kEnumNames<E>) {
    if (e.value == value) return e.name;
  }
  return "?";
}

// "a, b, c": every name of E, in table order.
template <typename E>
std::string enum_name_list() {
  std::string out;
  for (const auto& e : kEnumNames<E>)
    out += (out.empty() ? "" : ", ") + std::string(e.name);
  return out;
}

// The value named `text`, if one is.
template <typename E>
constexpr std::optional<E> find_enum(std::string_view text) {
  for (const auto& e : kEnumNames<E>) {
    if (text == e.name) return e.value;
  }
  return std::nullopt;
}

// The value named `text`; throws distmuon::Error "unknown <what> '<text>'; valid: <names>".
template <typename E>
E parse_enum(std::string_view text, std::string_view what) {
  if (const std::optional<E> v = find_enum<E>(text)) return *v;
  throw Error(fmt::format("unknown {} '{}'; valid: {}", what, text, enum_name_list<E>()));
}

}  // namespace distmuon::detail
