#pragma once
// File helpers shared by the optimizer's checkpoints (checkpoint.h), the trainer's checkpoints and
// the .npy writer: atomic writes, whole-file reads, JSON files and the FNV-1a 64 checksum that
// the manifests record. Every failure throws distmuon::Error naming the file and the problem.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace distmuon {

// Writes bytes to path atomically: path.tmp.<pid>, fsync, rename, fsync of the directory. A failed
// write leaves the previous file (or none) and removes the temporary one.
void write_file_atomic(const std::filesystem::path& path, const void* data, std::size_t size);

// The whole file's bytes.
std::vector<char> read_file_bytes(const std::filesystem::path& path);

// The file parsed as JSON; throws "'<path>' is not valid JSON: ..." when it is not.
nlohmann::json read_json_file(const std::filesystem::path& path);

inline constexpr std::uint64_t kFnv1a64Basis = 0xcbf29ce484222325ULL;

// FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3) of size bytes, continuing from
// hash (the basis for a fresh checksum). It detects corruption and truncation, not tampering.
std::uint64_t fnv1a64(const void* data, std::size_t size, std::uint64_t hash = kFnv1a64Basis);
std::string checksum_hex(std::uint64_t checksum);  // 16 lowercase hex digits

// Throws "'<path>' fails its checksum (FNV-1a 64 <actual>, manifest <expected>)" unless the
// checksum of bytes is expected_hex (as checksum_hex writes it).
void verify_checksum(const std::filesystem::path& path, const std::vector<char>& bytes,
                     const std::string& expected_hex);

}  // namespace distmuon
