#include "doc_blocks.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>

namespace distmuon::test {

bool update_docs_requested(const char* value) {
  return value != nullptr && std::string_view(value) == "1";
}

namespace {

constexpr std::string_view kMarker = "<!-- doc-output:";
constexpr std::string_view kEnd = "-->";

}  // namespace

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    const auto nl = text.find('\n', start);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines)
    out += l + "\n";
  return out;
}

std::vector<DocBlock> find_doc_blocks(const std::vector<std::string>& lines) {
  std::vector<DocBlock> blocks;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string line = trim(lines[i]);
    if (!line.starts_with(kMarker)) continue;
    if (!line.ends_with(kEnd))
      throw std::runtime_error(
          fmt::format("line {}: a doc-output marker must end with -->", i + 1));
    DocBlock b;
    b.marker_line = i + 1;
    std::string spec =
        trim(line.substr(kMarker.size(), line.size() - kMarker.size() - kEnd.size()));
    if (spec.starts_with("ignore=/")) {
      const auto close = spec.find("/ ", 8);
      if (close == std::string::npos)
        throw std::runtime_error(fmt::format("line {}: ignore=/REGEX/ is not closed", i + 1));
      b.ignore = spec.substr(8, close - 8);
      std::regex check(b.ignore);  // throws std::regex_error for a bad pattern
      spec = trim(spec.substr(close + 1));
    }
    if (spec.empty())
      throw std::runtime_error(fmt::format("line {}: marker without a command", i + 1));
    b.command = spec;
    if (i + 1 >= lines.size() || !trim(lines[i + 1]).starts_with("```"))
      throw std::runtime_error(
          fmt::format("line {}: a doc-output marker must be followed by a ``` block", i + 1));
    b.first = i + 2;
    std::size_t j = b.first;
    while (j < lines.size() && trim(lines[j]) != "```")
      ++j;
    if (j == lines.size())
      throw std::runtime_error(fmt::format("line {}: the block after it is not closed", i + 1));
    b.last = j;
    b.content.assign(lines.begin() + static_cast<std::ptrdiff_t>(b.first),
                     lines.begin() + static_cast<std::ptrdiff_t>(b.last));
    blocks.push_back(std::move(b));
    i = j;
  }
  return blocks;
}

std::vector<std::string> normalize_output(const std::string& text) {
  std::vector<std::string> lines = split_lines(text);
  for (auto& l : lines) {
    const auto e = l.find_last_not_of(" \t\r");
    l.erase(e == std::string::npos ? 0 : e + 1);
  }
  while (!lines.empty() && lines.back().empty())
    lines.pop_back();
  return lines;
}

std::vector<std::string> compared_lines(const std::vector<std::string>& lines,
                                        const std::string& ignore) {
  if (ignore.empty()) return lines;
  const std::regex re(ignore);
  std::vector<std::string> kept;
  for (const auto& l : lines)
    if (!std::regex_search(l, re)) kept.push_back(l);
  return kept;
}

std::string describe_difference(const std::vector<std::string>& doc,
                                const std::vector<std::string>& tool, const std::string& ignore) {
  const auto a = compared_lines(doc, ignore);
  const auto b = compared_lines(tool, ignore);
  if (a == b) return {};
  std::size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k])
    ++k;
  return fmt::format(
      "compared line {} differs ({} compared lines in the doc, {} from the tool)\n"
      "  doc:  {}\n  tool: {}",
      k + 1, a.size(), b.size(), k < a.size() ? a[k] : "(end of block)",
      k < b.size() ? b[k] : "(end of output)");
}

std::vector<std::string> replace_blocks(const std::vector<std::string>& lines,
                                        const std::vector<DocBlock>& blocks,
                                        const std::vector<std::vector<std::string>>& outputs) {
  if (blocks.size() != outputs.size())
    throw std::logic_error("replace_blocks: one output per block");
  std::vector<std::string> out;
  std::size_t next = 0;
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    out.insert(out.end(), lines.begin() + static_cast<std::ptrdiff_t>(next),
               lines.begin() + static_cast<std::ptrdiff_t>(blocks[k].first));
    out.insert(out.end(), outputs[k].begin(), outputs[k].end());
    next = blocks[k].last;
  }
  out.insert(out.end(), lines.begin() + static_cast<std::ptrdiff_t>(next), lines.end());
  return out;
}

}  // namespace distmuon::test
