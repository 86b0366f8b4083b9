// The decision map of `distmuon plan --map`, drawn by gnuplot (plot/gnuplot.h).
#include <fmt/format.h>

#include <cmath>

#include "distmuon/plots.h"
#include "plot/gnuplot.h"

namespace distmuon {
namespace {

constexpr double kMinLog2 = 8, kMaxLog2 = 16, kStep = 0.25;  // 256 .. 65536, four points per octave

}  // namespace

void render_decision_map(const PlanOptions& opts, const std::vector<WeightShape>& weights,
                         const std::filesystem::path& png) {
  detail::GnuplotJob job("plan --map");

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
  const std::string grid_file = job.data("grid.dat", grid);
  const std::string weights_file =
      job.data("weights.dat", points.empty() ? "NaN NaN none\n" : points);

  std::string tics;
  for (int e = static_cast<int>(kMinLog2); e <= static_cast<int>(kMaxLog2); ++e) {
    tics += fmt::format("{}\"{}\" {}", tics.empty() ? "" : ", ", 1L << e, e);
  }
  const std::string script = fmt::format(
      R"gp({terminal}
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
      fmt::arg("terminal", detail::gnuplot_png_terminal(960, 800)), fmt::arg("png", job.output()),
      fmt::arg("title", detail::gnuplot_quoted("tp_mode=auto decision: " + opts.describe())),
      fmt::arg("lo", kMinLog2 - kStep / 2), fmt::arg("hi", kMaxLog2 + kStep / 2),
      fmt::arg("tics", tics), fmt::arg("grid", grid_file), fmt::arg("weights", weights_file));
  job.run(script, png);
}

}  // namespace distmuon
