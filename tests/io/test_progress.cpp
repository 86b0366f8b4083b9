// The progress line of long commands: rewritten in place on a terminal (a pseudo-terminal here),
// nothing at all in a file or when disabled.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>
#include <utility>

#include "distmuon/progress.h"

namespace distmuon {
namespace {

// A pseudo-terminal in raw mode (no newline translation), with a window of `columns` (0: none,
// as OpenMPI gives its ranks): `out` writes to it, read() returns what reached the other side.
class Pty {
 public:
  explicit Pty(unsigned short columns = 80) {
    int master = -1, slave = -1;
    winsize size{};
    size.ws_row = 24;
    size.ws_col = columns;
    if (::openpty(&master, &slave, nullptr, nullptr, &size) != 0) return;
    termios t{};
    if (::tcgetattr(slave, &t) == 0) {
      ::cfmakeraw(&t);
      ::tcsetattr(slave, TCSANOW, &t);
    }
    master_ = master;
    out_ = ::fdopen(slave, "w");
  }
  ~Pty() {
    if (out_ != nullptr) std::fclose(out_);
    if (master_ >= 0) ::close(master_);
  }
  std::FILE* out() const { return out_; }
  std::string read() const {
    std::string got;
    char buf[4096];
    pollfd p{master_, POLLIN, 0};
    while (::poll(&p, 1, 100) == 1 && (p.revents & POLLIN) != 0) {
      const ssize_t n = ::read(master_, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    return got;
  }

 private:
  int master_ = -1;
  std::FILE* out_ = nullptr;
};

TEST(ProgressLine, RewritesOneLineOnATerminal) {
  ASSERT_EQ(::unsetenv("DISTMUON_PROGRESS"), 0);
  Pty pty;
  if (pty.out() == nullptr) GTEST_SKIP() << "no pseudo-terminal here (openpty failed)";
  EXPECT_TRUE(is_terminal(pty.out()));
  {
    ProgressLine line(pty.out(), true, 0.0);
    ASSERT_TRUE(line.active());
    line.update("step 1/3");
    line.update("step 2/3");
    line.clear();
    line.clear();  // nothing shown: nothing to erase
    line.update("step 3/3");
  }  // the destructor erases the line
  EXPECT_EQ(pty.read(), "\rstep 1/3\x1b[K\rstep 2/3\x1b[K\r\x1b[K\rstep 3/3\x1b[K\r\x1b[K");
}

TEST(ProgressLine, UpdatesCloserThanTheIntervalAreSkipped) {
  ASSERT_EQ(::unsetenv("DISTMUON_PROGRESS"), 0);
  Pty pty;
  if (pty.out() == nullptr) GTEST_SKIP() << "no pseudo-terminal here (openpty failed)";
  {
    ProgressLine line(pty.out(), true, 3600.0);
    line.update("first");
    line.update("second");  // within the hour: skipped
  }
  EXPECT_EQ(pty.read(), "\rfirst\x1b[K\r\x1b[K");
}

TEST(ProgressLine, NothingWhenDisabledOrNotATerminal) {
  ASSERT_EQ(::unsetenv("DISTMUON_PROGRESS"), 0);
  {
    Pty no_window(0);  // what a rank sees under mpirun
    if (no_window.out() == nullptr) GTEST_SKIP() << "no pseudo-terminal here (openpty failed)";
    EXPECT_FALSE(is_terminal(no_window.out()));
    ASSERT_EQ(::setenv("DISTMUON_PROGRESS", "1", 1), 0);  // the launcher knows better
    EXPECT_TRUE(is_terminal(no_window.out()));
    ASSERT_EQ(::unsetenv("DISTMUON_PROGRESS"), 0);
  }
  Pty pty;
  if (pty.out() == nullptr) GTEST_SKIP() << "no pseudo-terminal here (openpty failed)";
  {
    ProgressLine line(pty.out(), false);  // e.g. --json, --log, or not rank 0
    EXPECT_FALSE(line.active());
    line.update("step 1/3");
  }
  EXPECT_EQ(pty.read(), "");

  const auto path = std::filesystem::temp_directory_path() /
                    ("distmuon_progress_" + std::to_string(::getpid()) + ".txt");
  std::FILE* file = std::fopen(path.c_str(), "w");
  ASSERT_NE(file, nullptr);
  EXPECT_FALSE(is_terminal(file));
  {
    ProgressLine line(file, true);
    EXPECT_FALSE(line.active());
    line.update("step 1/3");
  }
  std::fclose(file);
  EXPECT_EQ(std::filesystem::file_size(path), 0u);
  ASSERT_EQ(::setenv("DISTMUON_PROGRESS", "0", 1), 0);  // off even on a terminal
  EXPECT_FALSE(is_terminal(pty.out()));
  ASSERT_EQ(::unsetenv("DISTMUON_PROGRESS"), 0);
  std::filesystem::remove(path);
}

// Off a terminal (a log file) an enabled line is written whole, "progress: ...\n", at most once per
// log interval: a long run says it is alive in its log without flooding it.
TEST(ProgressLine, WholeLinesAtTheLogIntervalIntoAFile) {
  ASSERT_EQ(::unsetenv("DISTMUON_PROGRESS"), 0);
  const auto path = std::filesystem::temp_directory_path() /
                    ("distmuon_progress_log_" + std::to_string(::getpid()) + ".txt");
  std::FILE* file = std::fopen(path.c_str(), "w");
  ASSERT_NE(file, nullptr);
  {
    ProgressLine now(file, true, 0.2, 0.0);  // every update is due
    EXPECT_FALSE(now.active());
    now.update("step 1/3");
    now.update("step 2/3");
    ProgressLine later(file, true, 0.2, 3600.0);  // none is due within the hour
    later.update("step 3/3");
  }
  std::fclose(file);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "progress: step 1/3\nprogress: step 2/3\n");
  std::filesystem::remove(path);
}

// Writes that fail (here /dev/full, unbuffered, so each write fails at once with ENOSPC) are
// ignored: update() does not throw, and neither does the destructor's clear() (it used to throw
// from the destructor: std::terminate).
TEST(ProgressLine, FailedWritesAreIgnored) {
  static_assert(std::is_nothrow_destructible_v<ProgressLine>);
  static_assert(noexcept(std::declval<ProgressLine&>().clear()));
  std::FILE* full = std::fopen("/dev/full", "w");
  if (full == nullptr) GTEST_SKIP() << "no /dev/full here";
  ASSERT_EQ(std::setvbuf(full, nullptr, _IONBF, 0), 0);
  ASSERT_EQ(::setenv("DISTMUON_PROGRESS", "1", 1), 0);  // a terminal, as far as the line knows
  {
    ProgressLine line(full, true, 0.0);
    ASSERT_TRUE(line.active());
    EXPECT_NO_THROW(line.update("step 1/3"));
    EXPECT_NO_THROW(line.update("step 2/3"));
  }  // the destructor clears the shown line: another failed write
  ASSERT_EQ(::unsetenv("DISTMUON_PROGRESS"), 0);
  std::fclose(full);
}

}  // namespace
}  // namespace distmuon
