// The tool output shown in README.md and docs/*.md against what the tool prints now: each block
// after a `<!-- doc-output: COMMAND -->` marker (doc_blocks.h) is compared with COMMAND's output,
// so a doc cannot silently contradict the tool. With DISTMUON_UPDATE_DOCS=1 the blocks are
// rewritten from the tool instead (review the diff before committing it).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "distmuon/file_io.h"
#include "doc_blocks.h"

namespace distmuon::test {
namespace {

namespace fs = std::filesystem;

TEST(DocBlocks, FindsMarkedBlocksWithTheirIgnorePattern) {
  const auto lines = split_lines(
      "text\n<!-- doc-output: distmuon plan --shape 8x8 -->\n```\na\nb\n```\nmore\n"
      "  <!-- doc-output: ignore=/^step / mpirun -np 2 distmuon train -->\n```text\nx\n```\n");
  const auto blocks = find_doc_blocks(lines);
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].marker_line, 2u);
  EXPECT_EQ(blocks[0].command, "distmuon plan --shape 8x8");
  EXPECT_EQ(blocks[0].ignore, "");
  EXPECT_EQ(blocks[0].content, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(blocks[1].command, "mpirun -np 2 distmuon train");
  EXPECT_EQ(blocks[1].ignore, "^step ");
  EXPECT_EQ(blocks[1].content, (std::vector<std::string>{"x"}));
  const auto replaced = replace_blocks(lines, blocks, {{"c"}, {"y", "z"}});
  EXPECT_EQ(join_lines(replaced),
            "text\n<!-- doc-output: distmuon plan --shape 8x8 -->\n```\nc\n```\nmore\n"
            "  <!-- doc-output: ignore=/^step / mpirun -np 2 distmuon train -->\n```text\ny\nz\n"
            "```\n");
}

TEST(DocBlocks, MalformedMarkersAreErrors) {
  EXPECT_THROW(find_doc_blocks(split_lines("<!-- doc-output: distmuon demo -->\ntext\n")),
               std::runtime_error);
  EXPECT_THROW(find_doc_blocks(split_lines("<!-- doc-output: distmuon demo -->\n```\na\n")),
               std::runtime_error);
  EXPECT_THROW(find_doc_blocks(split_lines("<!-- doc-output: ignore=/x distmuon -->\n```\n```\n")),
               std::runtime_error);
  EXPECT_THROW(find_doc_blocks(split_lines("<!-- doc-output: -->\n```\n```\n")),
               std::runtime_error);
}

TEST(DocBlocks, ComparisonSkipsIgnoredLinesOnly) {
  const std::vector<std::string> doc{"head", "step 1 12.0 ms", "tail"};
  EXPECT_EQ(describe_difference(doc, {"head", "step 1 13.5 ms", "tail"}, "^step "), "");
  EXPECT_NE(describe_difference(doc, {"head", "step 1 13.5 ms", "tail"}, ""), "");
  const std::string d = describe_difference(doc, {"head", "step 1 12.0 ms", "tall"}, "^step ");
  EXPECT_NE(d.find("compared line 2"), std::string::npos) << d;
  EXPECT_NE(describe_difference(doc, {"head", "tail", "extra"}, "^step "), "");
  EXPECT_EQ(normalize_output("a  \nb\n\n\n"), (std::vector<std::string>{"a", "b"}));
}

// Runs a block's command (bash, distmuon on the PATH) in an empty folder; its output, or a
// failure naming the command.
std::optional<std::string> run_block(const DocBlock& b, const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "command.sh") << "export PATH='" << DISTMUON_CLI_DIR << "':\"$PATH\"\n"
                                    << b.command << "\n";
  const std::string cmd = fmt::format(
      "cd '{}' && timeout -k 5 300 bash -o pipefail command.sh > out 2>&1", dir.string());
  const int status = std::system(cmd.c_str());
  const std::string out = read_text(dir / "out");
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << "`" << b.command << "` failed (status " << status << "):\n" << out;
    return std::nullopt;
  }
  return out;
}

// DISTMUON_UPDATE_DOCS rewrites the docs only when it is 1: 0, an empty value or anything else
// checks them (it used to rewrite them whenever the variable was set).
TEST(DocOutputs, OnlyOneRequestsAnUpdate) {
  EXPECT_TRUE(update_docs_requested("1"));
  for (const char* value : {static_cast<const char*>(nullptr), "", "0", "no", "10", "true"})
    EXPECT_FALSE(update_docs_requested(value)) << (value ? value : "(unset)");
}

TEST(DocOutputs, BlocksEqualWhatTheToolPrints) {
  const fs::path root(DISTMUON_SOURCE_DIR);
  const bool update = update_docs_requested(std::getenv("DISTMUON_UPDATE_DOCS"));
  const bool have_mpi = !std::string(DISTMUON_MPIEXEC).empty();
  std::vector<fs::path> docs{root / "README.md"};
  for (const auto& e : fs::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") docs.push_back(e.path());
  std::sort(docs.begin(), docs.end());
  const fs::path work =
      fs::temp_directory_path() / fmt::format("distmuon_doc_outputs_{}", ::getpid());
  int checked = 0;
  std::map<std::string, std::optional<std::string>> ran;  // a command shown twice runs once
  for (const auto& doc : docs) {
    const std::string rel = fs::relative(doc, root).string();
    const auto lines = split_lines(read_text(doc));
    std::vector<DocBlock> blocks;
    try {
      blocks = find_doc_blocks(lines);
    } catch (const std::exception& e) {
      ADD_FAILURE() << rel << ": " << e.what();
      continue;
    }
    std::vector<std::vector<std::string>> outputs;
    for (const auto& b : blocks) {
      if (!have_mpi && b.command.find("mpirun") != std::string::npos) {
        outputs.push_back(b.content);  // no MPI in this build: left as it is
        continue;
      }
      if (!ran.contains(b.command)) ran[b.command] = run_block(b, work);
      const auto& out = ran[b.command];
      outputs.push_back(out ? normalize_output(*out) : b.content);
      ++checked;
      if (!out || update) continue;
      const std::string diff = describe_difference(b.content, outputs.back(), b.ignore);
      EXPECT_EQ(diff, "") << rel << ":" << b.marker_line << ": the block of `" << b.command
                          << "` is not what the tool prints now.\n"
                          << "To regenerate the doc blocks from the tool: DISTMUON_UPDATE_DOCS=1 "
                             "ctest --test-dir build -R test_doc_outputs (then review git diff).";
    }
    if (update && !blocks.empty()) {
      const std::string text = join_lines(replace_blocks(lines, blocks, outputs));
      write_file_atomic(doc, text.data(), text.size());
    }
  }
  fs::remove_all(work);
  EXPECT_GT(checked, 0) << "no doc-output blocks found under " << root;
}

}  // namespace
}  // namespace distmuon::test
