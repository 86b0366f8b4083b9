#pragma once
// File helpers shared by the optimizer's checkpoints (checkpoint.h), the trainer's checkpoints and
// the .npy writer: atomic writes, whole-file reads, JSON files and the FNV-1a 64 checksum that
// the manifests record. Every failure throws distmuon::Error naming the file and the problem.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distmuon/hash.h"

namespace distmuon {

// Throws distmuon::Error "<what> '<path>': is a directory, not a regular file" (or a device
// node, a FIFO, a socket) unless path names nothing yet or a regular file; a symbolic link is
// judged by its target. Every command that writes a file checks its outputs with this before it
// starts, and write_file_atomic checks again: an output must never replace a folder or a device
// (`orthogonalize IN /dev/null` as root would rename a regular file over the device node).
void check_output_file(const std::filesystem::path& path, std::string_view what);

// Writes bytes to path atomically: path.tmp.<pid>, fsync, rename, fsync of the directory. A failed
// write leaves the previous file (or none) and removes the temporary one. A path that is not a
// regular file or new (check_output_file) is refused before anything is written.
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
