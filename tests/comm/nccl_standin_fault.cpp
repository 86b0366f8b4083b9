// A job for the fault cases of the NCCL communicator on the stand-in NCCL (check_nccl_fault.cmake),
// on the opaque backend with an NCCL data plane, many NCCL operations each, ended as the distmuon
// tool ends: an error every rank agreed on (CollectiveError) ends each rank with status 3, any
// other error aborts the job. The fault comes from the environment (DISTMUON_FAULT at the point
// "nccl", or the stand-in's DISTMUON_STANDIN_ASYNC_ERROR). The work: distributed NS steps
// (blocking collectives), or with the argument "owner" owner mode's pipeline over the world
// (src/tp/owner_ns.h: every NCCL operation a started all-to-all, waited later, while other chunks'
// NS runs), so that a fault hits exchanges in flight.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/layout.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"
#include "tp/owner_ns.h"
#include "tp/sharded_ns.h"

namespace {

using namespace distmuon;

void distributed_ns(const Communicator& world, Compute& compute) {
  Matrix shard(8, 16);
  for (Index i = 0; i < shard.size(); ++i)
    shard.data()[i] = static_cast<float>((i * 7 + world.rank()) % 11) - 5.0f;
  for (int run = 0; run < 20; ++run) {
    DeviceMatrix x = to_device(compute, shard.view());
    newton_schulz_tp(x.view(), 0, world, TpMode::kDistributed, NsOptions{}, compute);
  }
}

// Six weights split by rows over the world, one owner each (LPT), in 4 chunks: 8 started
// exchanges per run (each chunk's gather and scatter).
void owner_pipeline(const Communicator& world, Compute& compute) {
  const Communicator tp = compute.data_communicator(world);
  const Communicator one = local_communicator();
  const int p = world.size();
  std::vector<ShardLayout> layouts;
  std::vector<DeviceMatrix> shards;
  for (int k = 0; k < 6; ++k) {
    layouts.push_back(
        {.m = 8 * p, .n = 12 + 4 * k, .tp_dim = 0, .tp_size = p, .tp_rank = world.rank()});
    Matrix s(8, 12 + 4 * k);
    for (Index i = 0; i < s.size(); ++i)
      s.data()[i] = static_cast<float>((i * 5 + k + world.rank()) % 13) - 6.0f;
    shards.push_back(to_device(compute, s.view()));
  }
  NsOptions ns;
  detail::OwnerOrthogonalizer orth(detail::ns_flops_cost(ns), 4);
  detail::NsWorkspaces workspaces;
  const detail::ScaleFn scale = [](Index, Index) { return 1.0; };
  std::vector<detail::OwnerOrthogonalizer::Weight> weights;
  for (std::size_t k = 0; k < shards.size(); ++k)
    weights.push_back({shards[k].view(), &layouts[k], &tp, &one});
  for (int run = 0; run < 20; ++run)
    orth.run(weights, ns, scale, compute, &workspaces);
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  const Communicator world = mpi_world();
  try {
    setenv("DISTMUON_OPAQUE_DATA_PLANE", "nccl", 1);
    const std::unique_ptr<Compute> opaque = make_opaque_compute();
    if (argc > 1 && std::strcmp(argv[1], "owner") == 0) {
      owner_pipeline(world, *opaque);
    } else {
      distributed_ns(world, *opaque);
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
