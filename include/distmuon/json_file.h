#pragma once
// Reading the JSON and text files a user names (training configs, hardware profiles, model
// presets, topology files, training data) with errors that say which file and what is wrong with
// it, in the user's terms: a folder given for a file, a JSON syntax error with its line and
// column, a key given twice. No message of the standard library or of nlohmann::json leaks out.

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace distmuon {

// The largest JSON file distmuon reads (configs, profiles, presets, topology files, wisdom,
// checkpoint manifests): the largest real one is a few hundred KiB.
inline constexpr std::uint64_t kMaxJsonFileBytes = std::uint64_t{64} << 20;

// The bytes of the regular file at path. Throws Error "<what> '<path>': ..." when it does not
// exist, is a folder ("is a directory, not a file"), is no regular file (a device such as
// /dev/zero, a FIFO, a socket: they may never end), holds more than max_bytes (checked from its
// size before anything is read), cannot be opened (with strerror) or the read fails.
std::string read_text_file(const std::filesystem::path& path, std::string_view what,
                           std::uint64_t max_bytes = kMaxJsonFileBytes);

// Throws as read_text_file does unless path is a regular file of at most max_bytes; returns its
// size. What every whole-file reader checks before it reads.
std::uint64_t check_input_file(const std::filesystem::path& path, std::string_view what,
                               std::uint64_t max_bytes);

// text parsed as JSON. Throws Error "<what>: not valid JSON: <reason> at line L, column C" for a
// syntax error, and "<what>: key 'K' appears twice in one object" for a duplicate key (JSON
// leaves duplicates undefined; nlohmann keeps the last one silently).
nlohmann::json parse_json_text(std::string_view text, std::string_view what);

// read_text_file then parse_json_text, with what naming the file: "<what> '<path>'".
nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view what);

// A nlohmann::json exception's message without its "[json.exception.type_error.302] " prefix.
std::string json_error_text(const nlohmann::json::exception& e);

}  // namespace distmuon
