#pragma once
// FNV-1a 64: the checksum of checkpoint files (file_io.h) and the hash ranks compare to agree on a
// value (agreement.h). It detects corruption, truncation and differing values, not tampering.

#include <cstddef>
#include <cstdint>

namespace distmuon {

inline constexpr std::uint64_t kFnv1a64Basis = 0xcbf29ce484222325ULL;

// FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3) of size bytes, continuing from
// hash (the basis for a fresh checksum).
std::uint64_t fnv1a64(const void* data, std::size_t size, std::uint64_t hash = kFnv1a64Basis);

}  // namespace distmuon
