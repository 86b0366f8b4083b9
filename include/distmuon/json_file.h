#pragma once
// Reading the JSON and text files a user names (training configs, hardware profiles, model
// presets, topology files, training data) with errors that say which file and what is wrong with
// it, in the user's terms: a folder given for a file, a JSON syntax error with its line and
// column, a key given twice. No message of the standard library or of nlohmann::json leaks out.

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace distmuon {

// The bytes of the regular file at path. Throws Error "<what> '<path>': ..." when it does not
// exist, is a folder ("is a directory, not a file"), cannot be opened (with strerror) or the read
// fails.
std::string read_text_file(const std::filesystem::path& path, std::string_view what);

// text parsed as JSON. Throws Error "<what>: not valid JSON: <reason> at line L, column C" for a
// syntax error, and "<what>: key 'K' appears twice in one object" for a duplicate key (JSON
// leaves duplicates undefined; nlohmann keeps the last one silently).
nlohmann::json parse_json_text(std::string_view text, std::string_view what);

// read_text_file then parse_json_text, with what naming the file: "<what> '<path>'".
nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view what);

// A nlohmann::json exception's message without its "[json.exception.type_error.302] " prefix.
std::string json_error_text(const nlohmann::json::exception& e);

}  // namespace distmuon
