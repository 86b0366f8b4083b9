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

#include "distmuon/comm.h"

namespace distmuon::cli {

// The text the ranks agree on: the subcommand, its options as `name=value` lines (sorted), and
// one `file NAME=PATH: size, checksum` line per existing input file named by an input option.
std::string command_line_text(const CLI::App& app);

// Collective over world. parsed: this rank's command line parsed (text from command_line_text);
// otherwise failure holds the parse error. Returns normally when every rank has the same text,
// or every rank the same parse error (each then reports it as usual). Otherwise throws
// CollectiveError on every rank: a rank's parse error, or the first option (line) that differs
// from rank 0's.
void agree_command_line(const Communicator& world, std::string_view text, std::string_view failure);

}  // namespace distmuon::cli
