// --device: the compute backend of demo, orthogonalize, bench and train.
#include <fmt/format.h>

#include <algorithm>

#include "command_line_errors.h"
#include "commands.h"

namespace distmuon::cli {

CLI::Option* DeviceCliOption::add_to(CLI::App& app) {
  return app
      .add_option("--device", name,
                  fmt::format("Compute backend: cpu, opaque (a CPU test backend whose memory the "
                              "host cannot address) or cuda (a GPU); this build has {}",
                              fmt::join(compute_backend_names(), ", ")))
      ->capture_default_str();
}

Compute& DeviceCliOption::resolve(const Communicator& world) const {
  const auto built = compute_backend_names();
  if (std::find(built.begin(), built.end(), name) == built.end()) {
    // Unknown, or not built: the same refusal on every rank, without communication.
    return *resolve_on_every_rank([&] { return &compute_backend(name); });
  }
  // A built backend may fail to start on some ranks only (a rank without a GPU): agreed on.
  Compute* compute = check_on_every_rank(world, fmt::format("--device {}", name),
                                         [&] { return &compute_backend(name); });
  return *compute;
}

}  // namespace distmuon::cli
