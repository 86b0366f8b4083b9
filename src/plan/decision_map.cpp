// The decision map of `distmuon plan --map`: data and a script in a temporary folder, drawn by
// gnuplot (run without a shell, its exit status checked).
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "distmuon/error.h"
#include "distmuon/plan.h"

extern char** environ;

namespace distmuon {
namespace {

namespace fs = std::filesystem;

constexpr double kMinLog2 = 8, kMaxLog2 = 16, kStep = 0.25;  // 256 .. 65536, four points per octave

// The gnuplot executable on PATH, or empty.
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

// A gnuplot single-quoted string ('' is a quote inside).
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

void write_file(const fs::path& file, const std::string& text) {
  std::ofstream out(file);
  out << text;
  out.close();
  if (!out) throw Error(fmt::format("plan --map: cannot write {}", file.string()));
}

// Runs gnuplot on script with its output in log; returns the exit status (or -1 with errno set).
int run_gnuplot(const fs::path& gnuplot, const fs::path& script, const fs::path& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::string exe = gnuplot.string(), arg = script.string();
  char* argv[] = {exe.data(), arg.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, environ);
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

void render_decision_map(const PlanOptions& opts, const std::vector<WeightShape>& weights,
                         const fs::path& png) {
  const fs::path gnuplot = find_on_path("gnuplot");
  if (gnuplot.empty()) {
    throw Error(
        "plan --map needs gnuplot, which is not on PATH (install it, e.g. apt-get install "
        "gnuplot)");
  }
  char tmpl[] = "/tmp/distmuon-map-XXXXXX";
  if (mkdtemp(tmpl) == nullptr)
    throw Error(fmt::format("plan --map: mkdtemp failed: {}", std::strerror(errno)));
  const fs::path dir = tmpl;

  // Decision per cell: 0 duplicated, 1 distributed; rows of constant m separated by blank lines.
  const HardwareProfile* profile = opts.profile ? &*opts.profile : nullptr;
  std::string grid;
  for (double lm = kMinLog2; lm <= kMaxLog2 + 1e-9; lm += kStep) {
    for (double ln = kMinLog2; ln <= kMaxLog2 + 1e-9; ln += kStep) {
      const auto m = static_cast<Index>(std::llround(std::exp2(lm)));
      const auto n = static_cast<Index>(std::llround(std::exp2(ln)));
      const CostEstimate e = estimate(opts.key(m, n), profile, opts.model);
      grid += fmt::format("{} {} {}\n", ln, lm, e.choice == TpMode::kDistributed ? 1 : 0);
    }
    grid += "\n";
  }
  std::string points;
  for (const auto& w : weights)
    points += fmt::format("{} {} {}\n", std::log2(double(w.n)), std::log2(double(w.m)), w.name);
  write_file(dir / "grid.dat", grid);
  write_file(dir / "weights.dat", points.empty() ? "NaN NaN none\n" : points);

  std::string tics;
  for (int e = static_cast<int>(kMinLog2); e <= static_cast<int>(kMaxLog2); ++e) {
    tics += fmt::format("{}\"{}\" {}", tics.empty() ? "" : ", ", 1L << e, e);
  }
  const std::string script = fmt::format(
      R"gp(if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {{ set terminal pngcairo size 960,800 font "sans,10" }} else {{ set terminal png size 960,800 }}
set output {png}
set title {title} noenhanced
set xlabel "n (columns)"
set ylabel "m (rows)"
set xrange [{lo}:{hi}]
set yrange [{lo}:{hi}]
set xtics ({tics})
set ytics ({tics})
set size ratio 1
set palette defined (0 "#9ecae1", 1 "#fdae6b")
set cbrange [0:1]
unset colorbox
set bmargin 6
set key at screen 0.5, screen 0.03 center horizontal noenhanced
plot {grid} using 1:2:3 with image notitle, \
     NaN with boxes fs solid lc rgb "#9ecae1" title "duplicated", \
     NaN with boxes fs solid lc rgb "#fdae6b" title "distributed", \
     {weights} using 1:2 with points pt 7 ps 1.3 lc rgb "black" title "weights", \
     {weights} using 1:2:3 with labels offset 0,1 font ",8" notitle
)gp",
      fmt::arg("png", quoted(png.string())),
      fmt::arg("title", quoted("tp_mode=auto decision: " + opts.describe())),
      fmt::arg("lo", kMinLog2 - kStep / 2), fmt::arg("hi", kMaxLog2 + kStep / 2),
      fmt::arg("tics", tics), fmt::arg("grid", quoted((dir / "grid.dat").string())),
      fmt::arg("weights", quoted((dir / "weights.dat").string())));
  write_file(dir / "map.gp", script);

  const int status = run_gnuplot(gnuplot, dir / "map.gp", dir / "gnuplot.log");
  if (status != 0) {
    const std::string why = status < 0 ? std::strerror(errno) : read_text(dir / "gnuplot.log");
    throw Error(fmt::format(
        "plan --map: gnuplot ({}) failed with status {}; script and data kept in {}: {}",
        gnuplot.string(), status, dir.string(), why));
  }
  std::error_code ec;
  if (!fs::is_regular_file(png, ec) || fs::file_size(png, ec) == 0) {
    throw Error(fmt::format("plan --map: gnuplot ran but wrote no {} (script kept in {}): {}",
                            png.string(), dir.string(), read_text(dir / "gnuplot.log")));
  }
  fs::remove_all(dir, ec);
}

}  // namespace distmuon
