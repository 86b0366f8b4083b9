// gnuplot runs: data and script in a temporary folder, gnuplot spawned without a shell, its exit
// status checked.
#include "plot/gnuplot.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "distmuon/error.h"
#include "distmuon/file_io.h"

extern char** environ;

namespace distmuon::detail {
namespace {

namespace fs = std::filesystem;

// The executable on PATH, or empty.
fs::path find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return {};
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// Runs gnuplot on script with its output in log; returns the exit status (or -1 with errno set).
int run_gnuplot(const fs::path& gnuplot, const fs::path& script, const fs::path& log) {
  posix_spawn_file_actions_t actions;
  int rc = posix_spawn_file_actions_init(&actions);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  rc = posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                        O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (rc == 0) rc = posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::string exe = gnuplot.string(), arg = script.string();
  char* argv[] = {exe.data(), arg.data(), nullptr};
  pid_t pid = 0;
  if (rc == 0) rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status)
                           : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string gnuplot_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string gnuplot_png_terminal(int width, int height) {
  return fmt::format(
      R"gp(if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {{ set terminal pngcairo size {w},{h} font "sans,10" }} else {{ set terminal png size {w},{h} }})gp",
      fmt::arg("w", width), fmt::arg("h", height));
}

GnuplotJob::GnuplotJob(std::string what) : what_(std::move(what)) {
  gnuplot_ = find_on_path("gnuplot");
  if (gnuplot_.empty()) {
    throw Error(fmt::format(
        "{} needs gnuplot, which is not on PATH (install it, e.g. apt-get install gnuplot)",
        what_));
  }
  char tmpl[] = "/tmp/distmuon-plot-XXXXXX";
  if (mkdtemp(tmpl) == nullptr)
    throw Error(fmt::format("{}: mkdtemp failed: {}", what_, std::strerror(errno)));
  dir_ = tmpl;
}

GnuplotJob::~GnuplotJob() {
  if (keep_) return;
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string GnuplotJob::data(const std::string& name, const std::string& text) {
  const fs::path file = dir_ / name;
  std::ofstream out(file);
  out << text;
  out.close();
  if (!out) {
    keep_ = true;
    throw Error(fmt::format("{}: cannot write {}", what_, file.string()));
  }
  return gnuplot_quoted(file.string());
}

std::string GnuplotJob::output() const {
  return gnuplot_quoted((dir_ / "plot.png").string());
}

void GnuplotJob::run(const std::string& script, const fs::path& png) {
  check_output_file(png, what_);
  data("plot.gp", script);
  std::error_code ec;
  const fs::path staged = dir_ / "plot.png";
  const int status = run_gnuplot(gnuplot_, dir_ / "plot.gp", dir_ / "gnuplot.log");
  if (status != 0) {
    keep_ = true;
    const std::string why = status < 0 ? std::strerror(errno) : read_text(dir_ / "gnuplot.log");
    throw Error(
        fmt::format("{}: gnuplot ({}) failed with status {}; script and data kept in {}: {}", what_,
                    gnuplot_.string(), status, dir_.string(), why));
  }
  if (!fs::is_regular_file(staged, ec) || fs::file_size(staged, ec) == 0) {
    keep_ = true;
    throw Error(fmt::format("{}: gnuplot ran but wrote no {} (script kept in {}): {}", what_,
                            png.string(), dir_.string(), read_text(dir_ / "gnuplot.log")));
  }
  const std::vector<char> bytes = read_file_bytes(staged);
  write_file_atomic(png, bytes.data(), bytes.size());
}

}  // namespace distmuon::detail
