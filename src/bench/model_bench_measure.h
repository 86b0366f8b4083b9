#pragma once
// The model benchmark with --plan measure: auto's plan made by timing its leading candidates
// (measure_plan.h) on the benchmark's own sharding, as the optimizer would before its first step.

#include <span>
#include <vector>

#include "distmuon/auto_mode.h"
#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/measure_plan.h"
#include "distmuon/model_bench.h"
#include "ns/ns_workspaces.h"

namespace distmuon::detail {

// keys: one per weight (count copies per shape, shapes in order), one bucket of them all.
// Collective over group. group (the GTP group: rows over all of it) and tp (this rank alone) carry
// compute's data plane (Compute::data_communicator); the candidates' shards live in compute's
// memory, their scratch comes from workspaces, and each run and reset ends with the backend
// synchronised, so that the planner's clock sees the backend's work.
MeasuredPlan measure_model_plan(const Communicator& group, const Communicator& tp,
                                const ModelBenchConfig& config,
                                std::span<const ModelBenchShape> shapes,
                                std::span<const AutoKey> keys, const AutoModeResolver& resolver,
                                Compute& compute, NsWorkspaces& workspaces);

// Records the measured plan in the report: the plan mode and timed runs, each shape's planned
// candidates, the planned time of the owner runs the planner timed, and auto's predicted total
// (the planner's time of its plan). shapes: the report's shapes, before they are moved into it.
void add_measured_plan(ModelBenchReport& report, std::span<ModelBenchShape> shapes,
                       const MeasuredPlan& plan);

}  // namespace distmuon::detail
