// `distmuon bench`: tensor-parallel Newton-Schulz per (shape, mode) against its measured bound.
// Run under `mpirun -np G`; prints a table (or one JSON object with --json) on rank 0.
#include <fmt/format.h>

#include <iostream>

#include <nlohmann/json.hpp>

#include "bench_model_options.h"
#include "blas_fix.h"
#include "cli_checks.h"
#include "command_line_errors.h"
#include "commands.h"
#include "distmuon/bench.h"
#include "distmuon/blas_info.h"
#include "distmuon/error.h"

namespace distmuon::cli {

void add_bench_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "bench", "Time TP Newton-Schulz per shape and mode against its bound (run under mpirun)");
  struct Opts {
    std::vector<std::string> shapes = {"4096x1024", "1024x4096", "2048x2048"};
    int partition_dim = 0;
    std::vector<std::string> modes = {"blockwise", "duplicated", "distributed"};
    int reps = 5, warmup = 1, rate_reps = 5, threads = 1;
    bool json = false;
    std::uint64_t seed = 0;
    NsCliOptions ns;
    BenchModelOptions model;  // --model: a model's shapes instead (bench_model_command.cpp)
    DeviceCliOption device;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--shape", o->shapes, "Matrix shapes MxN (repeatable)")->capture_default_str();
  cmd->add_option("--partition-dim", o->partition_dim, "Dimension the shards split")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  cmd->add_option("--modes", o->modes, "Comma-separated TP modes")
      ->delimiter(',')
      ->check(CLI::IsMember({"blockwise", "duplicated", "distributed"}))
      ->capture_default_str();
  cmd->add_option("--reps", o->reps, "Timed runs per (shape, mode)")
      ->check(at_least<int>(1))
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed runs first")
      ->check(at_least<int>(0))
      ->capture_default_str();
  cmd->add_option("--rate-reps", o->rate_reps,
                  "Timed runs of each sgemm and collective measurement")
      ->check(at_least<int>(1))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "BLAS threads per rank")
      ->check(at_least<int>(1))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random matrices")
      ->check(at_least<std::uint64_t>(0))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the tables");
  o->ns.add_to(*cmd,
               "with --model: auto (measure both and let auto pick per weight; the default "
               "measures standard, as the optimizer runs by default)");
  o->model.add_to(*cmd);
  o->device.add_to(*cmd)->description(
      "Compute backend: cpu, opaque (a CPU test backend whose memory the host cannot address) or "
      "cuda (a GPU)");
  cmd->callback([o, cmd, &ctx] {
    if (o->model.active()) {
      run_bench_model(
          o->model, {o->modes, o->reps, o->warmup, o->threads, o->json, o->seed, o->ns, o->device},
          *cmd, ctx);
      return;
    }
    const TpBenchConfig config = resolve_on_every_rank([&] {
      TpBenchConfig c;
      c.shapes.clear();
      for (const auto& s : o->shapes)
        c.shapes.push_back(parse_shape(s, "--shape"));
      c.partition_dim = o->partition_dim;
      c.modes.clear();
      for (const auto& m : o->modes)
        c.modes.push_back(parse_tp_mode(m));
      c.ns = o->ns.resolve();
      c.timing = {o->warmup, o->reps};
      c.rate_timing = {1, o->rate_reps};
      c.seed = o->seed;
      return c;
    });
    Compute& compute = o->device.resolve(ctx.world);
    set_blas_threads(o->threads);
    TpBenchConfig run = config;
    run.ns.precision = o->ns.precision_on(compute);
    const TpBenchReport report = run_tp_bench(ctx.world, run, compute);
    if (ctx.world.rank() != 0) return;
    if (o->json) {
      nlohmann::json j = to_json(report);
      j["device"] = o->device.name;
      j["blas"] = blas_json();
      std::cout << j.dump(2) << std::endl;
    } else {
      std::cout << "device: " << o->device.name << "\nBLAS: " << blas_summary() << "\n"
                << format_report(report) << std::flush;
    }
  });
}

}  // namespace distmuon::cli
