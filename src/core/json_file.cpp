#include "distmuon/json_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "distmuon/error.h"

namespace distmuon {

std::uint64_t check_input_file(const std::filesystem::path& path, std::string_view what,
                               std::uint64_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_directory(st))
    throw Error(fmt::format("{} '{}' is a directory, not a file", what, path.string()));
  if (!fs::exists(st)) throw Error(fmt::format("{} '{}' does not exist", what, path.string()));
  if (!fs::is_regular_file(st)) {
    throw Error(
        fmt::format("{} '{}' is not a regular file (a device, a pipe or a socket, which "
                    "may never end); give a file",
                    what, path.string()));
  }
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    throw Error(fmt::format("{} '{}': cannot read its size ({})", what, path.string(),
                            std::strerror(ec.value())));
  }
  if (size > max_bytes) {
    throw Error(fmt::format(
        "{} '{}' has {} bytes, more than the {} bytes (= {:.3g} GiB) a {} may "
        "have",
        what, path.string(), size, max_bytes, static_cast<double>(max_bytes) / (1u << 30), what));
  }
  return size;
}

std::string read_text_file(const std::filesystem::path& path, std::string_view what,
                           std::uint64_t max_bytes) {
  const std::uint64_t size = check_input_file(path, what, max_bytes);
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(fmt::format("{} '{}': cannot open it ({})", what, path.string(),
                            errno != 0 ? std::strerror(errno) : "unknown reason"));
  }
  // At most size + 1 bytes are read: a file that grew after its size was read is refused.
  std::string text(static_cast<std::size_t>(size + 1), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw Error(fmt::format("{} '{}': reading it failed", what, path.string()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > size) {
    throw Error(
        fmt::format("{} '{}' grew past its {} bytes while it was read; read it again once "
                    "it is complete",
                    what, path.string(), size));
  }
  return text;
}

std::string json_error_text(const nlohmann::json::exception& e) {
  std::string_view s = e.what();
  if (s.starts_with("[json.exception.")) {
    const auto close = s.find("] ");
    if (close != std::string_view::npos) s.remove_prefix(close + 2);
  }
  return std::string(s);
}

nlohmann::json parse_json_text(std::string_view text, std::string_view what) {
  using json = nlohmann::json;
  // One set of keys per open object; a key seen twice in the same object is refused.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  const json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), check);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", what, json_error_text(e)));
  }
  if (!duplicate.empty())
    throw Error(fmt::format("{}: key '{}' appears twice in one object", what, duplicate));
  return j;
}

nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view what) {
  const std::string text = read_text_file(path, what);
  return parse_json_text(text, fmt::format("{} '{}'", what, path.string()));
}

}  // namespace distmuon
