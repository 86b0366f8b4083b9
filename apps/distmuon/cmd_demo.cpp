// `distmuon demo`: orthogonalise a random matrix and report time, GFLOP/s, the singular values and
// the signed alignment with the true polar factor (a reversed result reads near -1).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "cli_checks.h"
#include "command_line_errors.h"
#include "commands.h"
#include "distmuon/blas_info.h"
#include "distmuon/memory_check.h"
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
    DeviceCliOption device;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--rows", o->m, "Rows")->check(at_least<Index>(1))->capture_default_str();
  cmd->add_option("--cols", o->n, "Columns")->check(at_least<Index>(1))->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed")
      ->check(at_least<unsigned>(0))
      ->capture_default_str();
  cmd->add_option("--reps", o->reps, "Timed runs after one warm-up (the median is reported)")
      ->capture_default_str()
      ->check(at_least<int>(1));
  o->ns.add_to(*cmd);
  o->device.add_to(*cmd);
  cmd->callback([o, &ctx] {
    NsOptions opts = resolve_on_every_rank([&] { return o->ns.resolve(); });
    Compute& compute = o->device.resolve(ctx.world);
    opts.precision = o->ns.precision_on(compute);
    // The input and its working copy, NS's workspace, and polar_alignment's float64 copies of the
    // input and the result and its three s x s matrices (singular_values needs less).
    const double m = static_cast<double>(o->m), n = static_cast<double>(o->n);
    const double s = std::min(m, n);
    // Every rank runs the same demo, alone; the memory each rank has may differ, so the ranks
    // agree on the check: a refusal on any rank ends every rank with its reason.
    check_on_every_rank(ctx.world, "demo", [&] {
      check_memory_fits(2 * sizeof(float) * m * n + ns_workspace_bytes(o->m, o->n) +
                            sizeof(double) * (2 * m * n + 3 * s * s),
                        fmt::format("demo of a {} matrix", shape_str(o->m, o->n)));
    });
    Matrix g(o->m, o->n);
    std::mt19937 rng(o->seed);
    std::normal_distribution<float> dist;
    for (float& v : g.values())
      v = dist(rng);
    // The input and the iterate in the backend's memory; the clock is read after synchronize().
    const DeviceMatrix input = to_device(compute, g.view());
    DeviceMatrix x(compute, o->m, o->n);
    NsWorkspace ws;
    compute.copy(input.view(), x.view());
    newton_schulz_inplace(x.view(), opts, compute, nullptr, &ws);  // warm-up
    std::vector<double> times;
    for (int r = 0; r < o->reps; ++r) {
      compute.copy(input.view(), x.view());
      compute.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      newton_schulz_inplace(x.view(), opts, compute, nullptr, &ws);
      compute.synchronize();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double sec = times[times.size() / 2];
    check_ns_result(x.view(), opts, compute);
    const Matrix result = to_host(compute, x.view());
    const auto sv = singular_values(result.view());
    const double alignment = polar_alignment(g.view(), result.view());
    if (ctx.world.rank() != 0) return;
    fmt::print("Newton-Schulz of a {} Gaussian matrix: {} x {} steps, {} path\n",
               shape_str(o->m, o->n), opts.coefficients.name, opts.steps,
               opts.use_syrk ? "syrk" : "gemm");
    fmt::print("  device          {}\n", o->device.name);
    fmt::print("  BLAS            {}\n", blas_summary());
    fmt::print("  time            {:.2f} ms (median of {}; min {:.2f} ms)\n", sec * 1e3,
               times.size(), times.front() * 1e3);
    fmt::print("  rate            {:.1f} GFLOP/s (plain-GEMM count, {:.2f} GFLOP)\n",
               ns_gemm_flops(o->m, o->n, opts.steps) / sec * 1e-9,
               ns_gemm_flops(o->m, o->n, opts.steps) * 1e-9);
    fmt::print("  singular values [{:.4f}, {:.4f}] (min, max over {})\n", sv.back(), sv.front(),
               sv.size());
    fmt::print(
        "  polar alignment {:.4f} (cosine with U V^T of the input; 1 = aligned, -1 = "
        "reversed)\n",
        alignment);
  });
}

}  // namespace distmuon::cli
