#pragma once
// Counter-based random numbers for deterministic initialisation and sampling: every draw is a
// pure function of its keys (seed, stream, counter), so results do not depend on the order of
// draws, the number of ranks or the platform's <random> implementation.

#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace distmuon::detail {

__extension__ typedef unsigned __int128 UInt128;  // GCC/Clang extension (quiet under -Wpedantic)

// SplitMix64's finaliser: a bijective mix of 64 bits.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A 64-bit hash of a list of keys.
inline std::uint64_t hash_keys(std::initializer_list<std::uint64_t> keys) {
  std::uint64_t h = 0x243f6a8885a308d3ULL;
  for (std::uint64_t k : keys)
    h = mix64(h ^ mix64(k));
  return h;
}

// Uniform in (0, 1): the top 53 bits, offset by half a step so that 0 never occurs.
inline double uniform_open(std::uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

// A standard normal from one 64-bit key (Box-Muller on two derived uniforms).
inline double normal_from(std::uint64_t key) {
  const double u1 = uniform_open(mix64(key));
  const double u2 = uniform_open(mix64(key ^ 0x5851f42d4c957f2dULL));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Uniform integer in [0, n) for n > 0 (Lemire's multiply-shift; each value's probability is off
// by at most n / 2^64 relative).
inline std::uint64_t uniform_below(std::uint64_t bits, std::uint64_t n) {
  return static_cast<std::uint64_t>((static_cast<UInt128>(bits) * n) >> 64);
}

}  // namespace distmuon::detail
