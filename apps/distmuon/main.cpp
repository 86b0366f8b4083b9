// distmuon command-line tool. Runs as one process or under mpirun.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <new>
#include <optional>
#include <string>

#include "blas_fix.h"
#include "command_line_agreement.h"
#include "commands.h"
#include "distmuon/blas_info.h"
#include "distmuon/error.h"
#include "error_exit.h"

int main(int argc, char** argv) {
  using namespace distmuon;
  using cli::print_error;
  std::optional<MpiRuntime> mpi;
  cli::Context ctx;
  // Redirected to a file or a pipe, stdout would be block-buffered: a run killed after an hour
  // would leave its log empty. Line-buffered, each line is in the file once printed.
  if (::isatty(STDOUT_FILENO) == 0) std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string command = "distmuon";  // the subcommand, once parsed (for out-of-memory errors)
  try {
    // A write past the file-size limit (ulimit -f) fails with EFBIG and is reported, instead of
    // SIGXFSZ ending the process halfway through a line with the other ranks left waiting.
    std::signal(SIGXFSZ, SIG_IGN);
    cli::fix_blas_core(argv);  // may re-execute this program: before MPI_Init
    if (launched_by_mpi()) {
      mpi.emplace(&argc, &argv);
      ctx.world = mpi_world();
    }
    spdlog::set_pattern(ctx.world.size() > 1
                            ? "[%l] [rank " + std::to_string(ctx.world.rank()) + "] %v"
                            : "[%l] %v");
    if (ctx.world.rank() != 0) spdlog::set_level(spdlog::level::warn);
    if (ctx.world.size() > 1) {
      // Ranks on different CPUs may run different kernels (and round differently).
      const std::string core = blas_core();
      const std::string root_core = ctx.world.broadcast_string(core, 0);
      if (core != root_core)
        spdlog::warn("BLAS: this rank runs OpenBLAS core {}, rank 0 runs {}", core, root_core);
    }

    CLI::App app{"distmuon: Muon's Newton-Schulz orthogonalisation on sharded weights"};
    // Parse errors in the user's words (subcommands inherit it: set before they are added).
    app.failure_message([](const CLI::App* a, const CLI::Error& e) {
      return fmt::format("{}\nRun with {} for more information.\n", cli::parse_error_message(e, a),
                         a->get_help_ptr() != nullptr ? a->get_help_ptr()->get_name() : "--help");
    });
    app.require_subcommand(1);
    app.set_version_flag("--version", "distmuon " DISTMUON_VERSION);
    // Given before or after the subcommand (a subcommand passes options it does not know to
    // this one). spdlog::level::from_str reads any unknown name as off: the names are checked.
    app.fallthrough();
    std::string log_level = "info";
    app.add_option("--log-level", log_level, "Messages shown: trace, debug, info, warn, error, off")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
        ->capture_default_str();
    bool agreed = false;  // the ranks agreed on their command lines (before any command runs)
    app.parse_complete_callback([&] {
      if (ctx.world.rank() == 0) spdlog::set_level(spdlog::level::from_str(log_level));
      for (const CLI::App* sub : app.get_subcommands())
        command = "distmuon " + sub->get_name();
      agreed = true;
      // One process has no peer to agree with: its input files are not read for fingerprints.
      if (ctx.world.size() > 1) cli::agree_command_line(ctx.world, cli::command_line_text(app), {});
    });
    cli::add_demo_command(app, ctx);
    cli::add_orthogonalize_command(app, ctx);
    cli::add_planning_commands(app, ctx);
    cli::add_train_command(app, ctx);
    cli::add_bench_command(app, ctx);
    cli::add_precision_command(app, ctx);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // A command line refused on some ranks only must not leave the others in the agreement.
      // --help and --version print instead of running a command: such a rank prints and ends
      // normally; the ranks that run a command say why they do not.
      const bool printed = e.get_exit_code() == 0;
      const std::string what =
          !printed ? fmt::format("{} (exit status {})", cli::parse_error_message(e, &app),
                                 e.get_exit_code())
          : dynamic_cast<const CLI::CallForVersion*>(&e) != nullptr ? "the version (--version)"
                                                                    : "the help (--help)";
      if (!agreed) {
        try {
          cli::agree_command_line(ctx.world, {}, what, printed);
        } catch (const cli::CommandLineError& d) {
          if (printed) return app.exit(e);
          if (ctx.world.rank() == d.reporter()) print_error(fmt::format(": {}", d.what()));
          return 1;
        }
      }
      const int rc = ctx.world.rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
      return rc;
    }
    return 0;
  } catch (const std::bad_alloc&) {
    // Sizes are estimated and refused before the work where they can be (check_memory_fits);
    // this is an allocation that still failed: said without the library's internals.
    print_error(fmt::format(
        "{}: {} ran out of memory (an allocation failed): use smaller sizes or more memory",
        ctx.world.size() > 1 ? fmt::format(" on rank {}", ctx.world.rank()) : "", command));
    if (ctx.world.size() > 1) ctx.world.abort(1);
    return 1;
  } catch (const cli::CommandLineError& e) {
    // The ranks ran different commands, or some printed the help or the version: said once.
    if (ctx.world.rank() == e.reporter()) print_error(fmt::format(": {}", e.what()));
    return 1;
  } catch (const CollectiveError& e) {
    // Agreed over the world: said once, by rank 0; over a subgroup only: the job is aborted.
    return cli::end_after_collective_error(ctx.world, e);
  } catch (const std::exception& e) {
    // This rank's own failure: said by it, with its rank.
    print_error(fmt::format(
        "{}: {}", ctx.world.size() > 1 ? fmt::format(" on rank {}", ctx.world.rank()) : "",
        e.what()));
    // Rank-local failures would leave the other ranks waiting in a collective; errors that every
    // rank of the world agreed on (agreement.h) end each rank on its own.
    if (ctx.world.size() > 1) ctx.world.abort(1);
    return 1;
  }
}
