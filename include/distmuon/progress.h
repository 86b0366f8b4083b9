#pragma once
// A progress line for long work (`bench --model`, `calibrate`, `train`): on a terminal, one line
// rewritten in place ('\r', then erase to the end of the line); into a pipe or a log file, a
// whole line "progress: ..." at a modest rate (every 30 s by default), so that a long run is
// seen to be alive there too; with JSON output (enabled false) nothing at all.

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
  // Shows only when enabled (the caller's choice: rank 0, no --json or --log). On a terminal,
  // updates closer together than min_interval_s are skipped; elsewhere an update is written as a
  // line once log_interval_s has passed since the start or the last line written.
  explicit ProgressLine(std::FILE* out = stdout, bool enabled = true, double min_interval_s = 0.2,
                        double log_interval_s = 30.0);
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
  bool logging_;  // enabled, not a terminal: whole lines at log_interval_s_
  bool shown_ = false;
  double min_interval_s_;
  double log_interval_s_;
  std::chrono::steady_clock::time_point last_{};
  std::chrono::steady_clock::time_point last_logged_ = std::chrono::steady_clock::now();
};

}  // namespace distmuon
