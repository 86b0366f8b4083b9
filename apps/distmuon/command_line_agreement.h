#pragma once
// Every rank of a job runs the same command: before its first collective, each command agrees on
// its whole parsed option set (every option of the command, defaults included; numbers by the
// value they parse to) and on fingerprints of the input files it names (a JSON file by its parsed
// content, any other by its size and the checksum of all its bytes). A
// launch that differs per rank (an MPMD command line, a launch script with a per-rank option, an
// input file that differs between nodes) ends every rank with an error naming the option or file,
// not in a hang, a crash or a mixed result.

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "distmuon/comm.h"
#include "distmuon/error.h"

namespace distmuon::cli {

// The text the ranks agree on: the subcommand, its options as `name=value` lines (sorted), and
// one `file NAME=PATH: size, checksum` line per existing input file named by an input option.
std::string command_line_text(const CLI::App& app);

// The command line's agreement failed: thrown on every rank; reporter() is the rank that says it
// (the lowest rank that did not print the help or the version; -1: every rank printed one).
class CommandLineError : public CollectiveError {
 public:
  CommandLineError(const std::string& message, ErrorScope scope, int reporter)
      : CollectiveError(message, std::move(scope)), reporter_(reporter) {}
  int reporter() const { return reporter_; }

 private:
  int reporter_;
};

// Collective over world. parsed: this rank's command line parsed (text from command_line_text);
// otherwise failure holds the parse error, or (printed: true) what this rank printed instead of
// running a command ("the version (--version)", "the help (--help)"). Returns normally when every
// rank has the same text, or every rank the same parse error or printout (each then reports it as
// usual). Otherwise throws CommandLineError on every rank: the ranks that printed the help or the
// version instead of running the others' command, a rank's parse error, or the first option
// (line) that differs from rank 0's.
void agree_command_line(const Communicator& world, std::string_view text, std::string_view failure,
                        bool printed = false);

// A command-line parse error in the user's words: CLI11's texts that name C++ types or its own
// internals ("1 required INT:INT in [1 - 100] missing", "Could not convert: --steps = 1e99")
// rewritten; any other text as CLI11 gives it. app: the command line's app, for the names of its
// commands when none was given.
std::string parse_error_message(const CLI::Error& e, const CLI::App* app = nullptr);

}  // namespace distmuon::cli
