#pragma once
// Subcommands of the distmuon CLI. Each file cmd_<name>.cpp adds one subcommand; its callback
// runs the command and may throw: main() catches once, prints the error and exits non-zero
// (aborting the MPI job when other ranks could be left waiting).

#include <CLI/CLI.hpp>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/newton_schulz.h"

namespace distmuon::cli {

struct Context {
  Communicator world = local_communicator();
};

// Options shared by commands that run Newton-Schulz.
struct NsCliOptions {
  std::string coefficients = "quintic";
  std::string custom;  // "a,b,c;a,b,c" when coefficients == "custom"
  int steps = 5;
  bool syrk = true;
  std::string algorithm = "standard";  // --ns-algorithm standard|gram (|auto: see add_to)
  int gram_restart = 0;
  std::string precision = "auto";  // --precision fp32|tf32|bf16|auto (auto: the backend's default)
  // auto_help: also accept --ns-algorithm auto, described by this text (the caller handles it;
  // resolve() refuses it).
  void add_to(CLI::App& app, const std::string& auto_help = "");
  // The options (at --precision, or fp32 for auto until precision_on resolves it).
  NsOptions resolve() const;
  // --precision, or compute's Compute::default_precision() for auto.
  Precision precision_on(const Compute& compute) const;
};

// --device: the compute backend a command runs on (compute_backend: cpu, opaque, cuda). Inputs
// read from files are uploaded to it, results downloaded before they are written.
struct DeviceCliOption {
  std::string name = "cpu";
  CLI::Option* add_to(CLI::App& app);
  // Collective: every rank resolves the device. A name that is no backend of this build fails
  // alike on every rank (naming the valid ones); a backend that a rank cannot start (no GPU)
  // becomes CollectiveError on every rank with that rank's reason.
  Compute& resolve(const Communicator& world) const;
};

// Throws when the result x of Newton-Schulz with opts holds a non-finite value, so that it is
// never printed or written: a guard (a divergent schedule is refused by NsOptions::validate, a
// non-finite input before the iteration; a device backend turns such an input into NaN).
// x lives in compute's memory.
void check_ns_result(ConstMatrixView x, const NsOptions& opts, Compute& compute);

void add_demo_command(CLI::App& app, Context& ctx);
void add_orthogonalize_command(CLI::App& app, Context& ctx);
void add_planning_commands(CLI::App& app, Context& ctx);  // plan, profiles, topology
void add_train_command(CLI::App& app, Context& ctx);
void add_bench_command(CLI::App& app, Context& ctx);
void add_precision_command(CLI::App& app, Context& ctx);

}  // namespace distmuon::cli
