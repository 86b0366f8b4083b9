#pragma once
// `distmuon bench --model NAME|FILE`: the options that switch `bench` from given shapes to a
// model's Muon shapes (include/distmuon/model_bench.h), and the run.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "commands.h"
#include "distmuon/matrix.h"
#include "distmuon/measure_plan.h"

namespace distmuon::cli {

struct BenchModelOptions {
  std::string model;  // empty: the shape benchmark
  std::string profile = "none", cost_model = "refined", plot, config;
  std::string plan = "estimate", wisdom;
  Index max_elements = Index{1} << 24;
  int plan_reps = MeasurePlanOptions{}.reps;
  bool replicated = false;  // --replicated: also time the weights replicated over the ranks
  int pipeline = 0;         // --pipeline (0: the cost model's choice)
  double link_latency_us = 0, link_gbps = 0;  // --link-latency-us, --link-gbps
  CLI::Option* model_cost_alias = nullptr;    // --model-cost, the deprecated --cost-model

  void add_to(CLI::App& cmd);
  bool active() const { return !model.empty(); }
};

// What `bench` shares with the model benchmark.
struct BenchCommonOptions {
  std::vector<std::string> modes;
  int reps = 5, warmup = 1, threads = 1;
  bool json = false;
  std::uint64_t seed = 0;
  NsCliOptions ns;
  DeviceCliOption device;  // the compute backend both benchmarks run on
};

// Runs the model benchmark and prints (rank 0) the table or the JSON; draws the plot if asked.
// cmd is `bench` (to refuse shape options given together with --model).
void run_bench_model(const BenchModelOptions& model, const BenchCommonOptions& common,
                     const CLI::App& cmd, Context& ctx);

}  // namespace distmuon::cli
