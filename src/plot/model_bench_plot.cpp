// The model benchmark's plot (`bench --model --plot`), drawn by gnuplot (plot/gnuplot.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "distmuon/plots.h"
#include "plot/gnuplot.h"

namespace distmuon {
namespace {

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

std::string label(const ModelBenchShape& s) {
  return fmt::format("{} {}x{} (x{})", fmt::join(s.names, ","), s.m, s.n, s.count);
}

}  // namespace

void render_model_bench_plot(const ModelBenchReport& r, const std::filesystem::path& png) {
  detail::GnuplotJob job("bench --plot");
  // One bar per (shape, candidate) at x = shape + offset; auto's bar gets a marker above it (when
  // auto planned owner mode for the model, no per-weight bar is its choice: see the title).
  const std::size_t candidates = r.shapes.empty() ? 0 : r.shapes.front().modes.size();
  const auto k = static_cast<double>(candidates);
  const double width = 0.8 / k;
  static const char* const kColors[] = {"#9ecae1", "#3182bd", "#fdae6b",
                                        "#e6550d", "#a1d99b", "#31a354"};
  std::string bars, marks, tics;
  for (std::size_t mi = 0; mi < candidates; ++mi) {
    for (std::size_t si = 0; si < r.shapes.size(); ++si) {
      const ModelBenchShape& s = r.shapes[si];
      const double x = static_cast<double>(si) + (static_cast<double>(mi) - (k - 1) / 2) * width;
      const double ms = s.modes[mi].time.median_s * 1e3;
      bars += fmt::format("{} {}\n", x, ms);
      if (!r.auto_owner && s.modes[mi].mode == s.auto_choice.mode &&
          s.modes[mi].algorithm == s.auto_choice.algorithm)
        marks += fmt::format("{} {}\n", x, ms * 1.35);
    }
    bars += "\n\n";  // one data block per mode
  }
  for (std::size_t si = 0; si < r.shapes.size(); ++si)
    tics += fmt::format("{}{} {}", si == 0 ? "" : ", ", detail::gnuplot_quoted(label(r.shapes[si])),
                        si);
  const std::string bars_file = job.data("bars.dat", bars);
  const std::string marks_file = job.data("auto.dat", marks);
  std::string plot;
  for (std::size_t mi = 0; mi < candidates; ++mi) {
    const ModelBenchMode& m = r.shapes.front().modes[mi];
    plot +=
        fmt::format("{} index {} using 1:2 with boxes fs solid 0.9 lc rgb \"{}\" title \"{}\", ",
                    bars_file, mi, kColors[mi % 6], to_string(AutoChoice{m.mode, m.algorithm}));
  }
  plot += fmt::format(
      "{} using 1:2 with points pt 7 ps 1.6 lc rgb \"black\" title \"auto's choice\"", marks_file);
  const std::string title = fmt::format(
      "NS time per weight, {} at G = {} (rows split); auto: profile {}, {} model{}; auto {:+.1f}% "
      "over the oracle",
      r.model, r.group_size, r.profile, r.cost_model, r.auto_owner ? ", owner for the model" : "",
      (ratio(r.totals.auto_s, r.totals.oracle_s) - 1) * 100);
  const std::string script = fmt::format(
      R"gp({terminal}
set output {png}
set title {title} noenhanced
set ylabel "median time per NS run (ms, log scale)"
set logscale y
set style fill solid 0.9 border rgb "#555555"
set boxwidth {width} absolute
set xrange [-0.6:{xmax}]
set xtics ({tics}) noenhanced
set grid ytics
set key top left noenhanced
plot {plot}
)gp",
      fmt::arg("terminal", detail::gnuplot_png_terminal(1100, 650)), fmt::arg("png", job.output()),
      fmt::arg("title", detail::gnuplot_quoted(title)), fmt::arg("width", width),
      fmt::arg("xmax", static_cast<double>(r.shapes.size()) - 0.4), fmt::arg("tics", tics),
      fmt::arg("plot", plot));
  job.run(script, png);
}

}  // namespace distmuon
