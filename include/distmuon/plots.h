#pragma once
// PNG plots of planning and benchmark results, drawn by gnuplot (part of the distmuon_train
// library, beside the trainer's loss curves in train_report.h; the core library draws nothing).
// Data files and a script go to a temporary folder, gnuplot runs on them without a shell and its
// exit status is checked. Each function throws distmuon::Error when gnuplot is not on PATH or
// fails (with its messages; the folder is kept and named on failure).

#include <filesystem>
#include <vector>

#include "distmuon/model_bench.h"
#include "distmuon/plan.h"

namespace distmuon {

// `plan --map`: the decision over a grid of (m, n) from 256 to 65536 (four points per octave) for
// the plan's options, with the given weights as points.
void render_decision_map(const PlanOptions& opts, const std::vector<WeightShape>& weights,
                         const std::filesystem::path& png);

// `bench --model --plot`: per-shape bars per mode (log scale), auto's choice marked.
void render_model_bench_plot(const ModelBenchReport& report, const std::filesystem::path& png);

}  // namespace distmuon
