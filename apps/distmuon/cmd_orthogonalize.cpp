// `distmuon orthogonalize IN.npy OUT.npy`: Newton-Schulz of a matrix read from a .npy file.
// Under `mpirun -np G` the matrix is split evenly along --partition-dim, each rank runs the
// --tp-mode on its shard, and the result is gathered back: rank 0 reads and writes the files,
// and a failure there (unreadable input, unwritable output) becomes an error on every rank.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <utility>

#include "command_line_errors.h"
#include "commands.h"
#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/json_file.h"
#include "distmuon/memory_check.h"
#include "distmuon/npy.h"
#include "distmuon/tp.h"

namespace distmuon::cli {
namespace {

// Rank 0 checks that the output path can take a file, then reads the matrix and checks that it
// is finite; every rank learns whether each worked (a bad output path is said as such, not as a
// failure to read the input).
Matrix read_on_root(const Communicator& world, const std::string& path, const std::string& out) {
  run_on_root(world, "checking the output path", [&] { check_output_file(out, "output"); });
  Matrix full;
  run_on_root(world, "reading the input", [&] {
    // The memory is checked from the file's size before anything is read: each rank holds the
    // whole matrix and the gathered result, rank 0 also the output (read_npy refuses a file whose
    // size is not its header's shape, so the size is the matrix's bytes), plus its shard and NS
    // scratch (ns_workspace_bytes: at most 5 s^2 + m n for an m x n shard). A 100000 x 100000 input
    // is refused at once, naming the need and the room.
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {  // a missing file: read_npy says so
      const double bytes = static_cast<double>(
          check_input_file(path, "input", std::numeric_limits<std::uint64_t>::max()));
      check_memory_fits(
          3.0 * bytes + 6.0 * bytes / world.size(),
          fmt::format("orthogonalize of '{}' ({:.2f} GiB of float32)", path, bytes / (1u << 30)));
    }
    full = read_npy(path);
    for (float v : full.values()) {
      if (!std::isfinite(v)) throw Error(fmt::format("'{}' contains non-finite values", path));
    }
  });
  return full;
}

// Broadcasts rank 0's matrix (shape, then values) to every rank.
Matrix broadcast_matrix(const Communicator& world, Matrix full) {
  std::int64_t shape[2] = {full.rows(), full.cols()};
  world.broadcast<std::int64_t>(shape, 0);
  if (world.rank() != 0) full = Matrix(shape[0], shape[1]);
  world.broadcast<float>(full.values(), 0);
  return full;
}

}  // namespace

void add_orthogonalize_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("orthogonalize", "Orthogonalise a 2-D float32 .npy matrix");
  struct Opts {
    std::string in, out;
    std::string tp_mode = "duplicated";
    int partition_dim = 0;
    NsCliOptions ns;
    DeviceCliOption device;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("input", o->in, "Input .npy (float32, C order, 2-D)")->required();
  cmd->add_option("output", o->out, "Output .npy (written atomically by rank 0)")->required();
  cmd->add_option("--tp-mode", o->tp_mode, "How the shards of the ranks are orthogonalised")
      ->check(CLI::IsMember({"blockwise", "duplicated", "distributed"}))
      ->capture_default_str();
  cmd->add_option("--partition-dim", o->partition_dim, "Dimension split over the ranks")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  o->ns.add_to(*cmd);
  o->device.add_to(*cmd);
  cmd->callback([o, &ctx] {
    const Communicator& world = ctx.world;
    NsOptions opts = resolve_on_every_rank([&] { return o->ns.resolve(); });
    Compute& compute = o->device.resolve(world);
    opts.precision = o->ns.precision_on(compute);
    const TpMode mode = parse_tp_mode(o->tp_mode);
    const int g = world.size(), dim = o->partition_dim;

    const Matrix full = broadcast_matrix(world, read_on_root(world, o->in, o->out));
    const Index extent = dim == 0 ? full.rows() : full.cols();
    if (extent % g != 0) {  // every rank sees the same shape: they all stop here
      throw CollectiveError(fmt::format("{} does not split into {} equal shards along dim {}",
                                        shape_str(full.view()), g, dim),
                            world.error_scope());
    }
    // This rank's shard runs on the backend; the result comes back to the host to be gathered.
    DeviceMatrix on_device = to_device(compute, shard_of(full.view(), dim, g, world.rank()).view());
    compute.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    newton_schulz_tp(on_device.view(), dim, world, mode, opts, compute);
    compute.synchronize();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const Matrix shard = to_host(compute, std::as_const(on_device).view());

    // Gather the shards (rank order) and reassemble the full matrix on rank 0.
    const auto count = static_cast<std::size_t>(shard.size());
    std::vector<float> gathered(count * static_cast<std::size_t>(g));
    world.all_gather<float>(shard.values(), gathered);
    run_on_root(world, "writing the output", [&] {
      Matrix out(full.rows(), full.cols());
      const Index sr = shard.rows(), sc = shard.cols();
      for (int r = 0; r < g; ++r) {
        const ConstMatrixView piece{gathered.data() + count * static_cast<std::size_t>(r), sr, sc,
                                    sc};
        copy(piece,
             dim == 0 ? out.view().block(sr * r, 0, sr, sc) : out.view().block(0, sc * r, sr, sc));
      }
      check_ns_result(out.view(), opts, cpu_compute());  // host memory
      write_npy(o->out, out.view());
    });
    if (world.rank() == 0) {
      fmt::print("orthogonalized {} -> {}: {} x {} steps, {} NS, {} on {} in {:.1f} ms\n",
                 shape_str(full.view()), o->out, o->ns.coefficients, opts.steps,
                 to_string(opts.algorithm),
                 g > 1 ? fmt::format("{} over {} ranks (dim {})", to_string(mode), g, dim)
                       : std::string("one process"),
                 o->device.name, sec * 1e3);
    }
  });
}

}  // namespace distmuon::cli
