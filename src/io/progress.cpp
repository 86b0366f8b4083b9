#include "distmuon/progress.h"

#include <fmt/format.h>
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

ProgressLine::ProgressLine(std::FILE* out, bool enabled, double min_interval_s)
    : out_(out), active_(enabled && is_terminal(out)), min_interval_s_(min_interval_s) {}

ProgressLine::~ProgressLine() {
  clear();
}

void ProgressLine::update(const std::string& text) {
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  if (shown_ && std::chrono::duration<double>(now - last_).count() < min_interval_s_) return;
  last_ = now;
  shown_ = true;
  // Progress is best effort: a failed write to the terminal is not worth stopping the work for.
  fmt::print(out_, "\r{}\x1b[K", text);
  std::fflush(out_);
}

void ProgressLine::clear() {
  if (!shown_) return;
  shown_ = false;
  fmt::print(out_, "\r\x1b[K");
  std::fflush(out_);
}

}  // namespace distmuon
