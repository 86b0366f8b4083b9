// A job for the fault cases of the NCCL communicator on the stand-in NCCL (check_nccl_fault.cmake):
// distributed NS steps on the opaque backend with an NCCL data plane, many collectives each, ended
// as the distmuon tool ends: an error every rank agreed on (CollectiveError) ends each rank with
// status 3, any other error aborts the job. The fault comes from the environment (DISTMUON_FAULT
// at the point "nccl", or the stand-in's DISTMUON_STANDIN_ASYNC_ERROR).
#include <cstdio>
#include <cstdlib>

#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"

int main(int argc, char** argv) {
  using namespace distmuon;
  MpiRuntime mpi(&argc, &argv);
  const Communicator world = mpi_world();
  try {
    setenv("DISTMUON_OPAQUE_DATA_PLANE", "nccl", 1);
    const std::unique_ptr<Compute> opaque = make_opaque_compute();
    Matrix shard(8, 16);
    for (Index i = 0; i < shard.size(); ++i)
      shard.data()[i] = static_cast<float>((i * 7 + world.rank()) % 11) - 5.0f;
    for (int run = 0; run < 20; ++run) {
      DeviceMatrix x = to_device(*opaque, shard.view());
      newton_schulz_tp(x.view(), 0, world, TpMode::kDistributed, NsOptions{}, *opaque);
    }
    std::printf("rank %d: done\n", world.rank());
    return 0;
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "rank %d: agreed error: %s\n", world.rank(), e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", world.rank(), e.what());
    std::fflush(stderr);
    world.abort(4);
  }
}
