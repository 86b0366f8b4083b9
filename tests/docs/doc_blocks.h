#pragma once
// Blocks of tool output in the markdown docs. A block is marked by a comment line
//
//   <!-- doc-output: [ignore=/REGEX/] COMMAND -->
//
// followed by a fenced block (``` ... ```) holding what COMMAND (a bash command line, `distmuon`
// on the PATH) prints, stdout and stderr together. Lines matching REGEX (ECMAScript syntax) are
// left out of the comparison on both sides: timings, losses and other figures that vary between
// runs or machines.

#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"  // read_text

namespace distmuon::test {

struct DocBlock {
  std::size_t marker_line = 0;  // 1-based line of the marker in the file
  std::string command;
  std::string ignore;                // the regex text, empty: compare every line
  std::size_t first = 0, last = 0;   // 0-based lines of the block's content: [first, last)
  std::vector<std::string> content;  // the block's lines
};

// Whether DISTMUON_UPDATE_DOCS (its value, nullptr when unset) asks to rewrite the blocks: "1"
// only, so that DISTMUON_UPDATE_DOCS=0 (or an empty value) checks them as usual.
bool update_docs_requested(const char* value);

// The line without its leading blanks and trailing blanks and carriage return.
std::string trim(const std::string& s);

std::vector<std::string> split_lines(const std::string& text);
std::string join_lines(const std::vector<std::string>& lines);

// Every marked block of a markdown text, in order. Throws std::runtime_error naming the line for
// a marker without a fenced block after it, or a block that is not closed.
std::vector<DocBlock> find_doc_blocks(const std::vector<std::string>& lines);

// Output as a block holds it: trailing spaces and trailing empty lines removed.
std::vector<std::string> normalize_output(const std::string& text);

// The lines of both that the comparison looks at (those not matching ignore).
std::vector<std::string> compared_lines(const std::vector<std::string>& lines,
                                        const std::string& ignore);

// Empty when the compared lines are equal, else a description of the first difference.
std::string describe_difference(const std::vector<std::string>& doc,
                                const std::vector<std::string>& tool, const std::string& ignore);

// lines with every block's content replaced by outputs[i] (same order as find_doc_blocks).
std::vector<std::string> replace_blocks(const std::vector<std::string>& lines,
                                        const std::vector<DocBlock>& blocks,
                                        const std::vector<std::vector<std::string>>& outputs);

}  // namespace distmuon::test
