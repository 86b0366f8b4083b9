#pragma once
// A progress line for long work (`bench --model`, `calibrate`, `train`): on a terminal, one line
// rewritten in place ('\r', then erase to the end of the line); anywhere else (a pipe, a log
// file, JSON output) nothing at all, so logs and machine-readable output stay clean.

#include <chrono>
#include <cstdio>
#include <string>

namespace distmuon {

// Whether `out` is a terminal a person watches: DISTMUON_PROGRESS=1 says yes and =0 no; otherwise
// isatty and a window of non-zero width. Under mpirun a rank's stdout is a pseudo-terminal of
// OpenMPI's with no window size whatever mpirun's own output is, so the ranks cannot tell; a
// launcher that knows (scripts/run.sh) sets DISTMUON_PROGRESS.
bool is_terminal(std::FILE* out);

class ProgressLine {
 public:
  // The line shows only when enabled (the caller's choice: rank 0, no --json or --log) and `out`
  // is a terminal. Updates closer together than min_interval_s are skipped.
  explicit ProgressLine(std::FILE* out = stdout, bool enabled = true, double min_interval_s = 0.2);
  ~ProgressLine() noexcept;  // clears the line (best effort: never throws)
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool active() const { return active_; }
  // Rewrites the line with text (no newline), unless the last update is too recent. Writes are
  // best effort: a failed write (a closed terminal, a full disk) is ignored, never thrown.
  void update(const std::string& text);
  // Erases the line, if one is shown, so that the next output starts at column 0 on a clean line.
  void clear() noexcept;

 private:
  std::FILE* out_;
  bool active_;
  bool shown_ = false;
  double min_interval_s_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace distmuon
