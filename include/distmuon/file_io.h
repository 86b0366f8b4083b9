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

#include "distmuon/hash.h"

namespace distmuon {

// Writes bytes to path atomically: path.tmp.<pid>, fsync, rename, fsync of the directory. A failed
// write leaves the previous file (or none) and removes the temporary one.
void write_file_atomic(const std::filesystem::path& path, const void* data, std::size_t size);

// The whole file's bytes.
std::vector<char> read_file_bytes(const std::filesystem::path& path);

// The file parsed as JSON; throws "'<path>' is not valid JSON: ..." when it is not.
nlohmann::json read_json_file(const std::filesystem::path& path);

// The checksum is fnv1a64 (hash.h).
std::string checksum_hex(std::uint64_t checksum);  // 16 lowercase hex digits

// Throws "'<path>' fails its checksum (FNV-1a 64 <actual>, manifest <expected>)" unless the
// checksum of bytes is expected_hex (as checksum_hex writes it).
void verify_checksum(const std::filesystem::path& path, const std::vector<char>& bytes,
                     const std::string& expected_hex);

}  // namespace distmuon
