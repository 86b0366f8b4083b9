#include "command_line_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <system_error>
#include <vector>

#include "distmuon/agreement.h"
#include "distmuon/hash.h"
#include "distmuon/json_file.h"

namespace distmuon::cli {
namespace {

// Options whose values name files the command reads (a value that is no existing regular file,
// such as a preset name, is agreed on as text only).
constexpr std::array kInputOptions = {"--config", "--data",  "--profile", "--plan",
                                      "--wisdom", "--model", "--map",     "input"};

// What a file named by an input option holds, as the ranks compare it: a JSON file (a config, a
// profile, a preset, wisdom) by its parsed content, so that a copy reformatted on one node (other
// indentation, key order kept or not) agrees; any other file by its size and the checksum of
// every byte (a difference in the middle of a large file counts as much as one at its ends).
// Files that are no regular file (a device, a FIFO: they may never end) are not read here: the
// command refuses them itself. Nor are files over kMaxFingerprintBytes, compared by their size
// only: no command reads one on every rank (the training text is at most 2 GiB and agreed byte
// by byte by the trainer; a larger .npy input is read by rank 0 alone and sent), and reading it
// would cost seconds per GiB before the command's own size checks could refuse it.
constexpr std::uintmax_t kMaxFingerprintBytes = std::uintmax_t{4} << 30;
std::string fingerprint(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return {};
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return {};
  if (size > kMaxFingerprintBytes) return fmt::format("{} bytes (content not compared)", size);
  std::ifstream in(path, std::ios::binary);
  if (!in) return fmt::format("{} bytes, unreadable", size);
  if (size <= kMaxJsonFileBytes) {
    std::string text(static_cast<std::size_t>(size), '\0');
    in.read(text.data(), static_cast<std::streamsize>(size));
    text.resize(static_cast<std::size_t>(in.gcount()));
    const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
    if (!parsed.is_discarded()) {
      const std::string canonical = parsed.dump();
      return fmt::format("JSON, checksum {:016x}", fnv1a64(canonical.data(), canonical.size()));
    }
    return fmt::format("{} bytes, checksum {:016x}", size, fnv1a64(text.data(), text.size()));
  }
  std::vector<char> buf(std::size_t{1} << 20);
  std::uint64_t h = kFnv1a64Basis;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = fnv1a64(buf.data(), static_cast<std::size_t>(in.gcount()), h);
  }
  return fmt::format("{} bytes, checksum {:016x}", size, h);
}

// A value as the command reads it: for a numeric option, the number it parses to (so that
// `--steps 03` and `--steps 3`, or `-4.775` and `-4.7750`, are one value); any other value as
// given.
std::string parsed_value(const CLI::Option& opt, const std::string& given) {
  const std::string type = opt.get_type_name();
  const bool numeric = type.starts_with("INT") || type.starts_with("UINT") ||
                       type.starts_with("FLOAT") || type.starts_with("NUMBER");
  if (!numeric || given.empty()) return given;
  const char* first = given.data() + (given.front() == '+' ? 1 : 0);
  const char* last = given.data() + given.size();
  double v = 0;
  const auto [end, err] = std::from_chars(first, last, v);
  if (err != std::errc() || end != last) return given;
  return fmt::format("{}", v);
}

void add_options(const CLI::App& app, const std::string& prefix, std::vector<std::string>& lines) {
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name();
    if (name == "--help" || name == "-h" || name == "--version") continue;
    const std::vector<std::string>& given = opt->results();
    std::vector<std::string> values;
    for (const std::string& v : given)
      values.push_back(parsed_value(*opt, v));
    const std::string value = opt->count() > 0 ? fmt::format("{}", fmt::join(values, ","))
                                               : "(default " + opt->get_default_str() + ")";
    lines.push_back(fmt::format("{}{}={}", prefix, name, value));
    if (std::find(kInputOptions.begin(), kInputOptions.end(), name) == kInputOptions.end())
      continue;
    for (const std::string& path : given) {
      if (const std::string f = fingerprint(path); !f.empty())
        lines.push_back(fmt::format("file {}{}={}: {}", prefix, name, path, f));
    }
  }
}

// The first line of mine that rank 0 does not have, and rank 0's line for the same option.
std::string first_difference(std::string_view root, std::string_view mine) {
  auto split = [](std::string_view s) {
    std::vector<std::string> out;
    for (std::size_t start = 0; start <= s.size();) {
      const std::size_t end = std::min(s.find('\n', start), s.size());
      out.emplace_back(s.substr(start, end - start));
      start = end + 1;
    }
    return out;
  };
  const std::vector<std::string> a = split(root), b = split(mine);
  if (a.front() != b.front())
    return fmt::format("'{}' where rank 0 runs '{}'", b.front(), a.front());
  for (const std::string& line : b) {
    if (std::find(a.begin(), a.end(), line) != a.end()) continue;
    const std::string key = line.substr(0, line.find('='));
    for (const std::string& other : a) {
      if (other.substr(0, other.find('=')) == key)
        return fmt::format("{} where rank 0 has {}", line, other);
    }
    return fmt::format("{} where rank 0 has none", line);
  }
  for (const std::string& line : a) {
    if (std::find(b.begin(), b.end(), line) == b.end())
      return fmt::format("no {} where rank 0 has it", line.substr(0, line.find('=')));
  }
  return "the same options in another order";
}

}  // namespace

std::string command_line_text(const CLI::App& app) {
  std::vector<std::string> lines;
  add_options(app, "", lines);
  std::string command = "distmuon";
  for (const CLI::App* sub : app.get_subcommands()) {
    command += " " + sub->get_name();
    add_options(*sub, sub->get_name() + " ", lines);
  }
  std::sort(lines.begin(), lines.end());
  return fmt::format("{}\n{}", command, fmt::join(lines, "\n"));
}

void agree_command_line(const Communicator& world, std::string_view text, std::string_view failure,
                        bool printed) {
  if (world.size() == 1) return;
  const std::string key = failure.empty() ? std::string(text) : "error: " + std::string(failure);
  if (all_agree(world, fnv1a64(key.data(), key.size()))) return;  // the same (or the same error)
  // Who printed the help or the version instead of running: they end normally, the lowest other
  // rank reports (one all-gather, and a broadcast of what was printed).
  const auto kinds = world.all_gather<std::int32_t>(printed ? 1 : 0);
  std::vector<int> printers;
  int reporter = -1;
  for (int r = 0; r < world.size(); ++r) {
    if (kinds[static_cast<std::size_t>(r)] != 0) {
      printers.push_back(r);
    } else if (reporter < 0) {
      reporter = r;
    }
  }
  if (!printers.empty()) {
    const std::string what =
        world.broadcast_string(printed ? std::string(failure) : std::string(), printers.front());
    throw CommandLineError(
        fmt::format("rank{} {} of {} printed {} and ran nothing, while the other ranks run a "
                    "command: give the same command line to every rank",
                    printers.size() > 1 ? "s" : "", fmt::join(printers, ","), world.size(), what),
        world.error_scope(), reporter);
  }
  try {
    agree_or_throw(
        world, failure.empty(), "the command line",
        fmt::format("{} (the ranks must run one command with the same options)", failure));
    agree_on(world, text, "the command line (every rank must run the same command and options)",
             first_difference);
  } catch (const CommandLineError&) {
    throw;
  } catch (const CollectiveError& e) {
    throw CommandLineError(e.what(), e.scope(), 0);
  }
}

std::string parse_error_message(const CLI::Error& e, const CLI::App* app) {
  const std::string text = e.what();
  std::smatch m;
  if (text == "A subcommand is required" && app != nullptr) {
    std::vector<std::string> names;
    for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; }))
      names.push_back(sub->get_name());
    return fmt::format("no command given (or an unknown one): one of {}", fmt::join(names, ", "));
  }
  // ArgumentMismatch::AtMost / AtLeast: "--steps: At Most 1 required but received 2".
  static const std::regex count(R"(^(\S+): At (Most|least) (\d+) required but received (\d+)$)");
  if (std::regex_match(text, m, count)) {
    return fmt::format("{}: given {} times, at {} {}", m[1].str(), m[4].str(),
                       m[2] == "Most" ? "most" : "least", m[3].str());
  }
  // ArgumentMismatch::TypedAtLeast: "--steps: 1 required INT:INT in [1 - 100] missing".
  static const std::regex missing(R"(^(\S+): (\d+) required .* missing$)");
  if (std::regex_match(text, m, missing)) {
    return m[2] == "1" ? fmt::format("{}: its value is missing", m[1].str())
                       : fmt::format("{}: {} values are missing", m[1].str(), m[2].str());
  }
  // ConversionError: "Could not convert: --steps = 99999999999999".
  static const std::regex convert(R"(^Could not convert: (\S+) = (.*)$)");
  if (std::regex_match(text, m, convert)) {
    return fmt::format(
        "{}: {} is not a value of this option (not a number of its kind, or out "
        "of its range)",
        m[1].str(), m[2].str());
  }
  // ConversionError: "The value X is not an allowed value for NAME".
  static const std::regex allowed(R"(^The value (.*) is not an allowed value for (\S+)$)");
  if (std::regex_match(text, m, allowed))
    return fmt::format("{}: {} is not an allowed value", m[2].str(), m[1].str());
  return text;
}

}  // namespace distmuon::cli
