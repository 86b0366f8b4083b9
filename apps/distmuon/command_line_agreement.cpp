#include "command_line_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "distmuon/agreement.h"
#include "distmuon/hash.h"

namespace distmuon::cli {
namespace {

// Options whose values name files the command reads (a value that is no existing regular file,
// such as a preset name, is agreed on as text only).
constexpr std::array kInputOptions = {"--config", "--data",  "--profile", "--plan",
                                      "--wisdom", "--model", "--map",     "input"};

// Size and checksum of the first and last MiB: a file that differs between the ranks' nodes
// differs there in practice (a config, a data file of another length or version), read in
// milliseconds however large the file.
std::string fingerprint(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return {};
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return {};
  std::ifstream in(path, std::ios::binary);
  if (!in) return fmt::format("{} bytes, unreadable", size);
  constexpr std::uintmax_t kEdge = 1 << 20;
  std::vector<char> buf(static_cast<std::size_t>(std::min(size, kEdge)));
  in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  std::uint64_t h = fnv1a64(buf.data(), static_cast<std::size_t>(in.gcount()));
  if (size > kEdge) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(size - std::min(size - kEdge, kEdge)));
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = fnv1a64(buf.data(), static_cast<std::size_t>(in.gcount()), h);
  }
  return fmt::format("{} bytes, checksum {:016x}", size, h);
}

void add_options(const CLI::App& app, const std::string& prefix, std::vector<std::string>& lines) {
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name();
    if (name == "--help" || name == "-h" || name == "--version") continue;
    const std::vector<std::string>& given = opt->results();
    const std::string value = opt->count() > 0 ? fmt::format("{}", fmt::join(given, ","))
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

void agree_command_line(const Communicator& world, std::string_view text,
                        std::string_view failure) {
  if (world.size() == 1) return;
  const std::string key = failure.empty() ? std::string(text) : "error: " + std::string(failure);
  if (all_agree(world, fnv1a64(key.data(), key.size()))) return;  // the same (or the same error)
  agree_or_throw(world, failure.empty(), "the command line",
                 fmt::format("{} (the ranks must run one command with the same options)", failure));
  agree_on(world, text, "the command line (every rank must run the same command and options)",
           first_difference);
}

}  // namespace distmuon::cli
