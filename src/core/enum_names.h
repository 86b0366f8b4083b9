#pragma once
// The look-ups every parse_* and to_string of distmuon's enums is written with, over one name
// table per enum: name_of(value), find_enum<E>(text), parse_enum<E>(text, what) and
// enum_name_list<E>().
//
// A table is a specialisation of kEnumNames in a private header of the folder that implements
// the enum (layer order: docs/architecture.md), e.g. tp/tp_mode_names.h. It lists every value
// once, in the order error messages list the names. test_enum_names checks every table.

#include <fmt/format.h>

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "distmuon/error.h"

namespace distmuon::detail {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The table of enum E; only the specialisations exist.
template <typename E>
inline constexpr auto kEnumNames = nullptr;

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
