// `distmuon demo`: orthogonalise a random matrix and report time, GFLOP/s and the singular values.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "command_line_errors.h"
#include "commands.h"
#include "distmuon/singular_values.h"

namespace distmuon::cli {

void add_demo_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "demo", "Orthogonalise a random Gaussian matrix and report speed and quality");
  struct Opts {
    Index m = 1024, n = 4096;
    unsigned seed = 0;
    int reps = 3;
    NsCliOptions ns;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--rows", o->m, "Rows")->capture_default_str();
  cmd->add_option("--cols", o->n, "Columns")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->add_option("--reps", o->reps, "Timed runs after one warm-up (the median is reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  o->ns.add_to(*cmd);
  cmd->callback([o, &ctx] {
    const NsOptions opts = resolve_on_every_rank([&] { return o->ns.resolve(); });
    Matrix g(o->m, o->n);
    std::mt19937 rng(o->seed);
    std::normal_distribution<float> dist;
    for (float& v : g.values())
      v = dist(rng);
    Matrix x = Matrix::from(g);
    NsWorkspace ws;
    newton_schulz_inplace(x.view(), opts, cpu_compute(), nullptr, &ws);  // warm-up
    std::vector<double> times;
    for (int r = 0; r < o->reps; ++r) {
      copy(g.view(), x.view());
      const auto t0 = std::chrono::steady_clock::now();
      newton_schulz_inplace(x.view(), opts, cpu_compute(), nullptr, &ws);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double sec = times[times.size() / 2];
    const auto sv = singular_values(x.view());
    if (ctx.world.rank() != 0) return;
    fmt::print("Newton-Schulz of a {} Gaussian matrix: {} x {} steps, {} path, {} BLAS thread(s)\n",
               shape_str(o->m, o->n), opts.coefficients.name, opts.steps,
               opts.use_syrk ? "syrk" : "gemm", blas_threads());
    fmt::print("  time            {:.2f} ms (median of {}; min {:.2f} ms)\n", sec * 1e3,
               times.size(), times.front() * 1e3);
    fmt::print("  rate            {:.1f} GFLOP/s (plain-GEMM count, {:.2f} GFLOP)\n",
               ns_gemm_flops(o->m, o->n, opts.steps) / sec * 1e-9,
               ns_gemm_flops(o->m, o->n, opts.steps) * 1e-9);
    fmt::print("  singular values [{:.4f}, {:.4f}] (min, max over {})\n", sv.back(), sv.front(),
               sv.size());
  });
}

}  // namespace distmuon::cli
