#pragma once
// Reading JSON data files (hardware profiles, model presets) with errors that name the field.

#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <type_traits>
#include <utility>

#include "distmuon/error.h"

namespace distmuon::detail {

// An integer field as T: a JSON integer within T's range. nlohmann's get<int>() would truncate
// 1.5 to 1 and wrap 2147483648 to a negative number.
template <typename T>
T json_integer(const nlohmann::json& v, const char* key, std::string_view what) {
  if (v.is_number_unsigned() && std::in_range<T>(v.get<std::uint64_t>()))
    return static_cast<T>(v.get<std::uint64_t>());
  if (v.is_number_integer() && !v.is_number_unsigned() && std::in_range<T>(v.get<std::int64_t>()))
    return static_cast<T>(v.get<std::int64_t>());
  throw Error(fmt::format("{}: field '{}' must be an integer in [{}, {}], got {}", what, key,
                          std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), v.dump()));
}

// The required field key of object j as T; `what` names the kind of file in the error.
template <typename T>
T json_field(const nlohmann::json& j, const char* key, std::string_view what) {
  const auto it = j.find(key);
  if (it == j.end()) throw Error(fmt::format("{}: missing field '{}'", what, key));
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (it->is_number()) return json_integer<T>(*it, key, what);
  }
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("{}: field '{}' has the wrong type ({}: {})", what, key,
                            it->type_name(), it->dump()));
  }
}

// Refuses a field of object j that is not among known: a misspelled optional field would
// otherwise be ignored and its default used silently. prefix names the enclosing object
// ("calibration.") in the message.
inline void json_known_fields(const nlohmann::json& j,
                              std::initializer_list<std::string_view> known, std::string_view what,
                              std::string_view prefix = "") {
  for (const auto& [key, value] : j.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    throw Error(fmt::format("{}: unknown field '{}{}' (valid: {})", what, prefix, key,
                            fmt::join(known, ", ")));
  }
}

template <typename T>
T json_field_or(const nlohmann::json& j, const char* key, T fallback, std::string_view what) {
  return j.contains(key) ? json_field<T>(j, key, what) : fallback;
}

}  // namespace distmuon::detail
