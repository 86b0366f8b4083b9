// A C++ program on a TP x GTP layout at 4 ranks that ends its ranks as the CLI does
// (apps/distmuon/error_exit.h), run by test_scoped_errors:
//  - with a topology file that lacks one rank's entry: tp_mode auto's domain probe fails on that
//    rank, agreed over the world (Topology::gather), so every rank ends normally with one error;
//  - with the argument "gtp-check": a check that fails in the GTP group of world rank 3 only,
//    agreed by that group ({1, 3}), while the other ranks go on into the step and wait for them.
//    Ending those two ranks normally leaves the others waiting forever; the error's scope (a
//    subgroup) makes the program abort the job instead.
#include <exception>
#include <string>
#include <vector>

#include "distmuon/agreement.h"
#include "distmuon/comm.h"
#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "distmuon/tp.h"
#include "error_exit.h"

int main(int argc, char** argv) {
  using namespace distmuon;
  MpiRuntime mpi(&argc, &argv);
  const Communicator world = mpi_world();
  try {
    const ProcessGroups g = make_process_groups(world, 2, world.size() / 2);
    if (argc > 1 && std::string(argv[1]) == "gtp-check")
      agree_or_throw(g.gtp, world.rank() != 3, "a check of the GTP group", "world rank 3's check");
    // 16 x 16: columns over the TP group, then rows over the GTP group: 8 x 8 on each rank.
    Matrix w(8, 8), grad(8, 8);
    for (Index i = 0; i < 8; ++i)
      for (Index j = 0; j < 8; ++j) {
        w(i, j) = static_cast<float>((i + 2 * j + world.rank()) % 5) - 2.0f;
        grad(i, j) = static_cast<float>((3 * i + j) % 7) - 3.0f;
      }
    Muon opt(MuonOptions{.tp_mode = TpMode::kAuto}, world, cpu_compute());
    opt.add_parameter({.name = "layer.w",
                       .local = w.view(),
                       .rows = 16,
                       .cols = 16,
                       .tp_partition_dim = 1,
                       .tp_group = g.tp,
                       .gtp_sharded = true,
                       .gtp_group = g.gtp});
    const ConstMatrixView grads[] = {grad.view()};
    opt.step(grads);
    if (world.rank() == 0) std::printf("step done\n");
    return 0;
  } catch (const CollectiveError& e) {
    return cli::end_after_collective_error(world, e);
  } catch (const std::exception& e) {
    cli::print_error(fmt::format(" on rank {}: {}", world.rank(), e.what()));
    world.abort(1);
  }
}
