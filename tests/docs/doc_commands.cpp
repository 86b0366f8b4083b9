#include "doc_commands.h"

#include "doc_blocks.h"

#include <fmt/format.h>

#include <algorithm>
#include <regex>
#include <sstream>

namespace distmuon::test {
namespace {

const std::regex kCommand(
    R"(^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:mpirun\s+(?:\S+\s+)*?)?(?:build/bin/)?distmuon(?:\s|$))");
const std::regex kSkip(R"(^\s*<!-- doc-commands: skip=(.+) -->\s*$)");

std::vector<std::string> tokens(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string t; in >> t;)
    out.push_back(t);
  return out;
}

// Index of the token "distmuon" (or build/bin/distmuon); tokens.size() if none.
std::size_t distmuon_at(const std::vector<std::string>& t) {
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t[i] == "distmuon" || t[i] == "build/bin/distmuon") return i;
  return t.size();
}

// Tool output shown in a block: "distmuon train: 2 ranks ...".
bool is_output(const std::string& line) {
  const auto t = tokens(line);
  const std::size_t d = distmuon_at(t);
  return d + 1 < t.size() && t[d + 1].ends_with(':');
}

std::string strip_comment(const std::string& line) {
  const auto hash = line.find(" #");
  return trim(hash == std::string::npos ? line : line.substr(0, hash));
}

}  // namespace

std::vector<DocCommand> find_doc_commands(const std::vector<std::string>& lines) {
  std::vector<DocCommand> out;
  bool fenced = false;
  bool indented_block = false;
  std::size_t block = 0;
  std::string skip, pending_skip;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string& raw = lines[i];
    const std::string line = trim(raw);
    std::smatch m;
    if (std::regex_match(raw, m, kSkip)) {
      pending_skip = trim(m[1].str());
      continue;
    }
    if (line.starts_with("```")) {
      fenced = !fenced;
      if (fenced) {
        ++block;
        skip = pending_skip;
      }
      pending_skip.clear();
      continue;
    }
    const bool indented = !fenced && raw.starts_with("    ") && !line.empty() &&
                          (indented_block || i == 0 || trim(lines[i - 1]).empty());
    if (!fenced && !indented) {
      indented_block = false;
      if (!line.empty()) pending_skip.clear();
      // Inline code spans of prose.
      std::size_t pos = 0;
      while ((pos = raw.find('`', pos)) != std::string::npos) {
        const auto close = raw.find('`', pos + 1);
        if (close == std::string::npos) break;
        const std::string span = trim(raw.substr(pos + 1, close - pos - 1));
        if (std::regex_search(span, kCommand) && !is_output(span))
          out.push_back({i + 1, span, true, "", 0});
        pos = close + 1;
      }
      continue;
    }
    if (indented && !indented_block) {
      indented_block = true;
      ++block;
      skip = pending_skip;
      pending_skip.clear();
    }
    if (!std::regex_search(line, kCommand) || is_output(line)) continue;
    DocCommand c{i + 1, "", false, skip, block};
    std::string text = line;
    while (text.ends_with("\\") && i + 1 < lines.size()) {
      text.pop_back();
      text = trim(text) + " " + trim(lines[++i]);
    }
    c.text = strip_comment(text);
    out.push_back(std::move(c));
  }
  return out;
}

bool is_synopsis(const std::string& command) {
  if (command.find_first_of("[|") != std::string::npos) return true;
  if (command.find("...") != std::string::npos) return true;
  static const std::regex placeholder(R"(^[A-Z][A-Z0-9_]*(\.[a-z]+)?$|MxN)");
  for (const auto& t : tokens(command)) {
    if (t.find('=') != std::string::npos) continue;  // VAR=value
    if (std::regex_search(t, placeholder)) return true;
  }
  return false;
}

std::string subcommand_of(const std::string& command) {
  const auto t = tokens(command);
  for (std::size_t i = distmuon_at(t) + 1; i < t.size(); ++i) {
    if (t[i].starts_with("-")) {
      if (t[i] == "--log-level") ++i;  // the one option before a subcommand that takes a value
      continue;
    }
    return t[i];
  }
  return "";
}

std::vector<std::string> options_of(const std::string& command) {
  std::vector<std::string> out;
  const auto t = tokens(command);
  for (std::size_t i = distmuon_at(t) + 1; i < t.size(); ++i) {
    if (t[i].starts_with(">") || t[i].starts_with("|") || t[i] == "2>&1") break;
    std::string s = t[i];
    std::replace_if(
        s.begin(), s.end(),
        [](char c) { return c == '[' || c == ']' || c == '(' || c == ')' || c == '|'; }, ' ');
    for (auto part : tokens(s)) {
      if (!part.starts_with("-") || part == "-" || part == "--") continue;
      if (const auto eq = part.find('='); eq != std::string::npos) part.resize(eq);
      out.push_back(part);
    }
  }
  return out;
}

std::string fast_command(const std::string& command, const std::string& tiny_config) {
  auto t = tokens(command);
  for (auto& s : t)
    if (s.starts_with("/tmp/")) s = s.substr(5);
  const std::string sub = subcommand_of(command);
  const auto has = [&](const std::string& opt) {
    return std::find(t.begin(), t.end(), opt) != t.end();
  };
  // Where appended options go: before a redirection or a pipe.
  auto end = std::find_if(t.begin(), t.end(), [](const std::string& s) {
    return s.starts_with(">") || s.starts_with("|") || s == "2>&1" || s == "&&";
  });
  std::vector<std::string> add;
  const auto add_unless = [&](const std::string& opt, const std::string& value) {
    if (!has(opt)) {
      add.push_back(opt);
      add.push_back(value);
    }
  };
  if (sub == "train") {
    add_unless("--config", tiny_config);
    const auto steps = std::find(t.begin(), t.end(), "--steps");
    if (steps != t.end() && steps + 1 != t.end()) {
      const int n = std::stoi(*(steps + 1));
      *(steps + 1) = std::to_string(std::max(1, (n + 9) / 10));
    } else {
      add_unless("--steps", "3");
    }
  } else if (sub == "calibrate") {
    add_unless("--sizes", "32,64");
    add_unless("--max-bytes", "4096");
    add_unless("--reps", "1");
    add_unless("--comm-reps", "2");
  } else if (sub == "bench") {
    add_unless("--reps", "1");
    add_unless("--warmup", "0");
    if (!has("--model")) {
      add_unless("--rate-reps", "1");
      add_unless("--shape", "128x64");
    } else {
      const auto model = std::find(t.begin(), t.end(), "--model");
      if (model + 1 != t.end() && *(model + 1) == "train-default")
        add_unless("--config", tiny_config);
    }
  } else if (sub == "demo") {
    add_unless("--rows", "128");
    add_unless("--cols", "256");
  }
  end = std::find_if(t.begin(), t.end(), [](const std::string& s) {
    return s.starts_with(">") || s.starts_with("|") || s == "2>&1" || s == "&&";
  });
  t.insert(end, add.begin(), add.end());
  std::string out;
  for (const auto& s : t)
    out += (out.empty() ? "" : " ") + s;
  return out;
}

}  // namespace distmuon::test
