#pragma once
// Checks of integer options that name the real range: CLI::PositiveNumber reports "0 not in
// range 0.000000 to 1.797e308", and CLI11's conversion saturates a uint64 that does not fit
// (--seed 99999999999999999999 read as 2^64 - 1). These parse the text with std::from_chars as
// the option's own type, so a value out of range is refused with the range it must be in.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compute/precision_names.h"
#include "distmuon/error.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "ns/ns_names.h"
#include "plan/plan_names.h"
#include "tp/tp_mode_names.h"

namespace distmuon::cli {

// The names of enum E (core/enum_names.h) after `first` (an option's own extra names, such as
// "auto"): the set its CLI::IsMember check accepts.
template <typename E>
std::vector<std::string> names_of(std::initializer_list<const char*> first = {}) {
  std::vector<std::string> out(first.begin(), first.end());
  for (const auto& e : detail::kEnumNames<E>)
    out.push_back(e.name);
  return out;
}

// An integer of type T from lo to hi (inclusive), in decimal.
template <typename T>
CLI::Validator in_range(T lo, T hi) {
  const std::string desc = fmt::format("INT in [{} - {}]", lo, hi);
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        T v{};
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc() && ptr == end && v >= lo && v <= hi) return {};
        return fmt::format("{} is not an integer from {} to {}", text, lo, hi);
      },
      desc);
}

// An integer of type T of at least lo (up to T's maximum).
template <typename T>
CLI::Validator at_least(T lo) {
  return in_range<T>(lo, std::numeric_limits<T>::max());
}

// A decimal number from lo to hi (inclusive); NaN and infinities are refused (CLI::Range lets
// NaN through: every comparison with it is false).
inline CLI::Validator number_in_range(double lo, double hi) {
  const std::string desc = fmt::format("NUMBER in [{} - {}]", lo, hi);
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = text.empty() ? std::nan("") : std::strtod(text.c_str(), &end);
        if (end == text.c_str() + text.size() && std::isfinite(v) && v >= lo && v <= hi) return {};
        return fmt::format("{} is not a number from {} to {}", text, lo, hi);
      },
      desc);
}

// A file or folder name: an empty one (--checkpoint '') would otherwise mean "not given" and
// be silently ignored, or name the current folder.
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? std::string("an empty name is no file or folder") : std::string();
      },
      "PATH");
}

// A weight shape "MxN" (or "MXN") given to `option`: both positive decimal integers of at most
// `max`.
inline std::pair<Index, Index> parse_shape(std::string_view text, std::string_view option,
                                           Index max = std::numeric_limits<Index>::max()) {
  const auto dimension = [max](std::string_view s, Index& v) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && end == s.data() + s.size() && v > 0 && v <= max;
  };
  const auto x = text.find_first_of("xX");
  Index m = 0, n = 0;
  if (x == std::string_view::npos || !dimension(text.substr(0, x), m) ||
      !dimension(text.substr(x + 1), n)) {
    throw Error(
        max == std::numeric_limits<Index>::max()
            ? fmt::format("{} '{}' is not MxN with positive M and N (e.g. 4096x1024)", option, text)
            : fmt::format("{} '{}' is not MxN with 1 <= M, N <= {}", option, text, max));
  }
  return {m, n};
}

// The most Newton-Schulz steps an option accepts: the library's bound (newton_schulz.h).
inline constexpr int kMaxNsStepsOption = kMaxNsSteps;

}  // namespace distmuon::cli
