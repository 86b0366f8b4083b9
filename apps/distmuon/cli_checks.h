#pragma once
// Checks of integer options that name the real range: CLI::PositiveNumber reports "0 not in
// range 0.000000 to 1.797e308", and CLI11's conversion saturates a uint64 that does not fit
// (--seed 99999999999999999999 read as 2^64 - 1). These parse the text with std::from_chars as
// the option's own type, so a value out of range is refused with the range it must be in.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <limits>
#include <string>

namespace distmuon::cli {

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

}  // namespace distmuon::cli
