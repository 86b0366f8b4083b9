#pragma once
// What the model benchmark predicts for the runs it times (bench --model's "predicted" figures):
// owner mode over the model on its schedule, and the model's weights replicated over the group.
// Pure functions of the weights, the profile and the schedule: the simulation of the same
// one-machine placement (`plan --parallel gtp=G,dp=G` for owner, `plan --parallel dp=G
// --optimizer-sharding none` for the replicas) prices them alike (tests/plan/
// test_bench_prediction.cpp).

#include <span>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/cost_model.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/model_preset.h"
#include "distmuon/newton_schulz.h"

namespace distmuon::detail {

// Owner mode over one bucket of keys (the bench's: one per weight, count copies per shape, each
// with the algorithm the run pins) on the schedule (its chunks, the emulated link): seconds, 0
// without a profile.
double predict_owner(std::span<const AutoKey> keys, const HardwareProfile* profile,
                     const ExchangeSchedule& schedule);
// The chunks the bucket of keys runs in when the bench's --pipeline is 0: the cost model's
// cheapest pipelined schedule over the link (estimate_owner_bucket with kChosenChunks, as the
// optimizer chooses; kUnpricedChunks capped at the matrices without a profile).
int chosen_owner_chunks(std::span<const AutoKey> keys, const HardwareProfile* profile,
                        LinkModel link);

// The replicated bench's runs (seconds; zeros without a profile) and auto's choice: every rank's
// NS, the homes on the serial schedule, on `pipeline` chunks and on `pipeline` chunks with the
// bf16 wire, each with the emulated link (pipeline kChosenChunks: the cost model's cheapest count
// for each, as the optimizer chooses it).
struct ReplicatedPrediction {
  double every_rank_s = 0, home_s = 0, home_pipelined_s = 0, home_bf16_s = 0;
  int pipelined_chunks = 1, bf16_chunks = 1;  // the chunks of the pipelined runs
  bool auto_home = false;  // on the pipelined schedule, fp32 wire (FLOPs without a profile)
  std::vector<int> homes;  // per weight (count copies per shape, in order)
};
ReplicatedPrediction predict_replicated(const std::vector<WeightShape>& weights,
                                        const NsOptions& ns, int replicas, bool crosses,
                                        const HardwareProfile* profile, CostModel model,
                                        int pipeline, LinkModel link);

}  // namespace distmuon::detail
