// `distmuon calibrate --out FILE.json`: measures this machine with the ranks of the job and writes
// a hardware profile that --profile accepts everywhere. See docs/cost-model.md.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "command_line_errors.h"
#include "distmuon/agreement.h"
#include "distmuon/blas_info.h"
#include "distmuon/calibrate.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/memory_check.h"
#include "distmuon/progress.h"
#include "planning_commands.h"

namespace distmuon::cli {

void add_calibrate_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "calibrate",
      "Measure sgemm/ssyrk rates and collective latency and bandwidth into a hardware profile");
  struct Opts {
    std::string out, name = "calibrated";
    CalibrateOptions c;
    int reps = 5, comm_reps = 20, threads = 1;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--out", o->out, "Profile file to write (JSON)")
      ->required()
      ->check(non_empty_path());
  cmd->add_option("--name", o->c.name, "The profile's name")->capture_default_str();
  cmd->add_option("--sizes", o->c.sizes, "sgemm / ssyrk sizes s (s x s x s), ascending")
      ->delimiter(',')
      ->check(in_range<Index>(1, kMaxCalibrateSize))
      ->capture_default_str();
  cmd->add_option("--min-bytes", o->c.min_bytes, "First collective payload")
      ->check(in_range<std::size_t>(1, kMaxCalibrateBytes))
      ->capture_default_str();
  cmd->add_option("--max-bytes", o->c.max_bytes, "Largest collective payload")
      ->check(in_range<std::size_t>(1, kMaxCalibrateBytes))
      ->capture_default_str();
  cmd->add_option("--factor", o->c.factor, "Ratio of consecutive payloads")
      ->check(CLI::Range(2, 1024))
      ->capture_default_str();
  cmd->add_option("--reps", o->reps, "Timed runs of each compute measurement")
      ->check(at_least<int>(1))
      ->capture_default_str();
  cmd->add_option("--comm-reps", o->comm_reps, "Timed runs of each collective size")
      ->check(at_least<int>(1))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "BLAS threads per rank (as NS will run)")
      ->check(at_least<int>(1))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print the profile as JSON instead of the tables");
  cmd->callback([o, &ctx] {
    log_to_stderr();
    // A file that cannot be written fails on every rank before the measurements.
    const std::filesystem::path out = o->out;
    run_on_root(ctx.world, "calibrate", [&] {
      std::error_code ec;
      const auto dir = out.has_parent_path() ? out.parent_path() : std::filesystem::path(".");
      if (!std::filesystem::is_directory(dir, ec)) {
        throw Error(fmt::format("--out {}: folder {} does not exist", out.string(), dir.string()));
      }
      check_output_file(out, "--out");
    });
    set_blas_threads(o->threads);
    CalibrateOptions c = o->c;
    c.compute_timing = {1, o->reps};
    c.comm_timing = {5, o->comm_reps};
    resolve_on_every_rank([&] { c.validate(); });
    // The largest measurement's buffers, checked on every rank before the first one.
    check_on_every_rank(ctx.world, "calibrate", [&] {
      check_memory_fits(c.memory_bytes(ctx.world.size()),
                        fmt::format("calibrate with sizes up to {} and payloads up to {} bytes",
                                    c.sizes.back(), c.max_bytes));
    });
    ProgressLine progress(stdout, ctx.world.rank() == 0 && !o->json);
    c.progress = [&](const std::string& what) { progress.update(what); };
    const CalibrationReport rep = calibrate(ctx.world, c, cpu_compute());
    progress.clear();
    run_on_root(ctx.world, "calibrate: writing the profile",
                [&] { save_profile(rep.profile, out); });
    if (ctx.world.rank() != 0) return;
    if (o->json) {
      spdlog::info("BLAS: {}", blas_summary());  // stdout holds the profile alone
      std::cout << nlohmann::json(rep.profile).dump(2) << std::endl;
    } else {
      std::cout << "BLAS: " << blas_summary() << "\n"
                << format_calibration(rep) << "written to " << out.string() << std::endl;
    }
  });
}

}  // namespace distmuon::cli
