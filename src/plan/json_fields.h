#pragma once
// Reading JSON data files (hardware profiles, model presets) with errors that name the field.

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string_view>

#include "distmuon/error.h"

namespace distmuon::detail {

// The required field key of object j as T; `what` names the kind of file in the error.
template <typename T>
T json_field(const nlohmann::json& j, const char* key, std::string_view what) {
  const auto it = j.find(key);
  if (it == j.end()) throw Error(fmt::format("{}: missing field '{}'", what, key));
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("{}: field '{}' has the wrong type ({}: {})", what, key,
                            it->type_name(), it->dump()));
  }
}

template <typename T>
T json_field_or(const nlohmann::json& j, const char* key, T fallback, std::string_view what) {
  return j.contains(key) ? json_field<T>(j, key, what) : fallback;
}

}  // namespace distmuon::detail
