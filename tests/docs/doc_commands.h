#pragma once
// Command lines shown in the markdown docs: every `distmuon ...` line in a code block (fenced, or
// indented by four spaces; a line ending in '\' continues on the next) and every `distmuon ...`
// inline code span. Lines that are tool output ("distmuon train: 2 ranks ...") are not commands.
//
// A block whose commands cannot run on this machine is marked in the markdown, on the line
// before its fence, with the reason:
//
//   <!-- doc-commands: skip=needs a CUDA GPU -->
//
// test_doc_commands counts those and fails for a `--device cuda` command left unmarked.

#include <string>
#include <vector>

namespace distmuon::test {

struct DocCommand {
  std::size_t line = 0;      // 1-based line of the command's first line in the file
  std::string text;          // the command, continuation lines joined, a trailing # comment removed
  bool inline_span = false;  // quoted in prose (`...`), not a line of a code block
  std::string skip;          // the block's skip reason; empty: not skipped
  std::size_t block = 0;     // code blocks: 1-based index of the block (commands of one block
                             // run in order in one folder); 0 for inline spans
};

std::vector<DocCommand> find_doc_commands(const std::vector<std::string>& lines);

// A synopsis rather than a runnable command: it holds [optional] parts, A|B alternatives, "..."
// or a placeholder such as NAME, FILE.json, IN.npy, MxN, G or N.
bool is_synopsis(const std::string& command);

// The distmuon subcommand of a command line ("" for `distmuon --version`), and the options it
// names ("--shape", "-G", "--syrk" and "--no-syrk" from "[--syrk|--no-syrk]"), in order.
std::string subcommand_of(const std::string& command);
std::vector<std::string> options_of(const std::string& command);

// The command as the test runs it: the same options at a size that takes seconds (docs show
// real runs of minutes). train: a tiny model config (--config FILE unless given) and a tenth of
// the steps (rounded up; 3 when not given); calibrate: sizes 32,64, payloads up to 4 KiB, one
// timed run; bench: one timed run, a 128x64 shape unless shapes or --model are given, the tiny
// config for --model train-default; demo: a 128x256 matrix. Paths under /tmp/ are made relative
// to the folder the command runs in.
std::string fast_command(const std::string& command, const std::string& tiny_config);

}  // namespace distmuon::test
