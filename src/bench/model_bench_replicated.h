#pragma once
// bench --model --replicated: the model's weights replicated over the group (data parallelism,
// unsharded), every rank's NS of every weight against one home per weight (owner mode spanning
// the replicas, tp/owner_ns.h) on the serial and the pipelined schedule and with the bf16 wire,
// timed in the same interleaved rounds, with the cost model's prediction of each
// (estimate_replica_bucket).

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/model_bench.h"

namespace distmuon::detail {

ModelBenchReplicated run_replicated_bench(const Communicator& group, const ModelBenchConfig& config,
                                          const HardwareProfile* profile, CostModel model,
                                          bool crosses, Compute& compute);

}  // namespace distmuon::detail
