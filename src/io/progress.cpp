#include "distmuon/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>

namespace distmuon {

bool is_terminal(std::FILE* out) {
  if (const char* forced = std::getenv("DISTMUON_PROGRESS")) return std::string_view(forced) == "1";
  if (out == nullptr) return false;
  const int fd = ::fileno(out);
  if (fd < 0 || ::isatty(fd) != 1) return false;  // 0 with errno ENOTTY/EBADF: not a terminal
  winsize size{};
  return ::ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0;
}

ProgressLine::ProgressLine(std::FILE* out, bool enabled, double min_interval_s,
                           double log_interval_s)
    : out_(out),
      active_(enabled && is_terminal(out)),
      logging_(enabled && !active_),
      min_interval_s_(min_interval_s),
      log_interval_s_(log_interval_s) {}

namespace {

// Progress is best effort: a failed write to the terminal is not worth stopping the work for, and
// the line is cleared from the destructor, which must not throw. std::fwrite and std::fflush
// report errors only through their results, which are ignored on purpose.
void write_best_effort(std::FILE* out, std::string_view text) noexcept {
  if (out == nullptr) return;
  static_cast<void>(std::fwrite(text.data(), 1, text.size(), out));
  static_cast<void>(std::fflush(out));
}

}  // namespace

ProgressLine::~ProgressLine() noexcept {
  clear();
}

void ProgressLine::update(const std::string& text) {
  const auto now = std::chrono::steady_clock::now();
  if (logging_) {
    if (std::chrono::duration<double>(now - last_logged_).count() < log_interval_s_) return;
    last_logged_ = now;
    write_best_effort(out_, "progress: " + text + "\n");
    return;
  }
  if (!active_) return;
  if (shown_ && std::chrono::duration<double>(now - last_).count() < min_interval_s_) return;
  last_ = now;
  shown_ = true;
  write_best_effort(out_, "\r" + text + "\x1b[K");
}

void ProgressLine::clear() noexcept {
  if (!shown_) return;
  shown_ = false;
  write_best_effort(out_, "\r\x1b[K");
}

}  // namespace distmuon
