// Owner mode's pipelined schedule against its serial one, on any grid of T TP x G GTP ranks
// (x D replicas whose homes span them), over an emulated link (docs/data-parallel.md, "Overlap"):
//
//   mpirun -np 4 build/bin/owner_overlap --tp 2 --gtp 2 [--replicas 1] [--model train-default]
//       [--chunks 4] [--link-gbps GBPS] [--link-latency-us US] [--warmup 1] [--reps 5]
//
// The model's Muon weights, each split over TP along its longer side (rows of a tall weight, as
// a column-parallel layer; columns of a wide one, as a row-parallel layer) and its TP-local rows
// over GTP (padded), are one owner bucket, the same on every replica. Four runs, interleaved in
// rounds (the planner's runner: the order rotating, each run's time the slowest rank's): the
// pipelined and the serial schedule (one chunk), each over the emulated link and over the
// machine's own transport. Prints the medians (and the spread), the pipelined run's ratio to the
// serial one over the link, and the serial schedule's exchanges (its time over the link less its
// time without) against the rest of its step, to set the link so that the two are about equal.
#include <fmt/format.h>

#include <cstdlib>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "distmuon/blas_info.h"
#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/fsdp.h"
#include "distmuon/measure_plan.h"
#include "distmuon/model_preset.h"
#include "distmuon/timing.h"
#include "distmuon/tp.h"
#include "plan/candidate_runner.h"
#include "tp/owner_ns.h"

namespace {
using namespace distmuon;

struct Options {
  int tp = 1, gtp = 1, replicas = 1, chunks = 4, warmup = 1, reps = 5;
  std::string model = "train-default";
  LinkModel link;
};

Options parse(int argc, char** argv) {
  std::map<std::string, std::string> given;
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    if (key.rfind("--", 0) != 0 || i + 1 >= argc)
      throw Error(fmt::format("owner_overlap: expected --option value, got '{}'", key));
    given[key.substr(2)] = argv[i + 1];
  }
  Options o;
  auto take = [&](const char* key, auto& value) {
    const auto it = given.find(key);
    if (it == given.end()) return;
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, std::string>) {
      value = it->second;
    } else {
      value = static_cast<std::decay_t<decltype(value)>>(std::stod(it->second));
    }
    given.erase(it);
  };
  double gbps = 0, latency_us = 0;
  take("tp", o.tp);
  take("gtp", o.gtp);
  take("replicas", o.replicas);
  take("chunks", o.chunks);
  take("warmup", o.warmup);
  take("reps", o.reps);
  take("model", o.model);
  take("link-gbps", gbps);
  take("link-latency-us", latency_us);
  if (!given.empty())
    throw Error(fmt::format("owner_overlap: unknown option --{}", given.begin()->first));
  o.link = {latency_us * 1e-6, gbps * 1e9};
  return o;
}

int run(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  const Communicator world = mpi_world();
  const Options o = parse(argc, argv);
  Compute& compute = cpu_compute();
  if (o.tp * o.gtp * o.replicas != world.size()) {
    throw Error(fmt::format("owner_overlap: --tp {} x --gtp {} x --replicas {} is not the {} ranks",
                            o.tp, o.gtp, o.replicas, world.size()));
  }
  const ProcessGroups pg = make_process_groups(world, o.tp, o.gtp);
  const int position = pg.tp.rank() + o.tp * pg.gtp.rank();
  const Communicator replicas = world.split(position, world.rank());
  auto planes = [&](const Communicator& c) {
    return c.has_data_plane() ? c : compute.data_communicator(c);
  };
  const Communicator tp = planes(pg.tp), gtp = planes(pg.gtp), dp = planes(replicas);
  const Communicator slow_tp = emulated_link_communicator(tp, o.link);
  const Communicator slow_gtp = emulated_link_communicator(gtp, o.link);
  const Communicator slow_dp = emulated_link_communicator(dp, o.link);

  // The bucket: every Muon weight of the model (count copies), this rank's shard of each.
  std::vector<detail::ShardLayout> layouts;
  std::vector<DeviceMatrix> source;
  std::uint64_t seed = 1;
  for (const WeightShape& w : model_weights(o.model)) {
    for (Index c = 0; c < w.count; ++c, ++seed) {
      detail::ShardLayout l{.m = w.m, .n = w.n};
      const int dim = w.m >= w.n ? 0 : 1;
      if (o.tp > 1) {
        if ((dim == 0 ? w.m : w.n) % o.tp != 0)
          throw Error(
              fmt::format("owner_overlap: {}x{} does not split over TP {}", w.m, w.n, o.tp));
        l.tp_dim = dim;
        l.tp_size = o.tp;
        l.tp_rank = pg.tp.rank();
      }
      const RowSharding rows = RowSharding::make(l.m_tp(), l.n_tp(), o.gtp);
      l.gtp_size = o.gtp;
      l.gtp_rank = pg.gtp.rank();
      l.pad = rows.pad_length;
      l.dp_size = o.replicas;
      l.dp_rank = replicas.rank();
      layouts.push_back(l);
      // The TP-local tensor of a Gaussian weight (the same on every replica), its GTP shard.
      Matrix local(l.m_tp(), l.n_tp());
      std::mt19937_64 rng(seed * 1000 + static_cast<std::uint64_t>(pg.tp.rank()));
      std::normal_distribution<float> normal;
      for (float& v : local.values())
        v = normal(rng);
      source.push_back(to_device(compute, row_shard(local.view(), rows, pg.gtp.rank()).view()));
    }
  }

  NsOptions ns;
  const detail::ScaleFn unit = [](Index, Index) { return 1.0; };
  struct Run {
    const char* label;
    int chunks;
    bool link;
    std::vector<DeviceMatrix> work;
    std::vector<detail::OwnerOrthogonalizer::Weight> weights;
    std::unique_ptr<detail::OwnerOrthogonalizer> orth;
  };
  std::vector<Run> runs;
  runs.push_back({"pipelined, over the link", o.chunks, true, {}, {}, {}});
  runs.push_back({"serial, over the link", 1, true, {}, {}, {}});
  runs.push_back({"pipelined, no link", o.chunks, false, {}, {}, {}});
  runs.push_back({"serial, no link", 1, false, {}, {}, {}});
  detail::NsWorkspaces workspaces;
  std::vector<MeasureTask> tasks;
  for (Run& r : runs) {
    detail::ResetCopies copies;
    for (std::size_t k = 0; k < source.size(); ++k)
      r.work.emplace_back(compute, source[k].rows(), source[k].cols());
    for (std::size_t k = 0; k < source.size(); ++k) {
      r.weights.push_back({r.work[k].view(), &layouts[k], r.link ? &slow_tp : &tp,
                           r.link ? &slow_gtp : &gtp, NsAlgorithm::kStandard,
                           o.replicas > 1 ? (r.link ? &slow_dp : &dp) : nullptr});
      copies.emplace_back(source[k].view(), r.work[k].view());
    }
    r.orth = std::make_unique<detail::OwnerOrthogonalizer>(detail::ns_flops_cost(ns), r.chunks);
    tasks.push_back({[&r, &ns, &unit, &compute, &workspaces] {
                       r.orth->run(r.weights, ns, unit, compute, &workspaces);
                       compute.synchronize();
                     },
                     detail::copy_reset(compute, std::move(copies))});
  }
  const std::vector<std::vector<double>> times =
      detail::run_candidates(world, tasks, {o.warmup, o.reps, "owner_overlap", {}});
  std::vector<TimingSummary> summary;
  std::vector<double> median;
  for (const auto& t : times) {
    summary.push_back(summarize(t));
    median.push_back(summary.back().median_s);
  }
  if (world.rank() == 0) {
    fmt::print("owner over {} ({} weights), TP {} x GTP {} x {} replicas, {} chunks, {} rounds\n",
               o.model, source.size(), o.tp, o.gtp, o.replicas, o.chunks, o.reps);
    fmt::print("{}; {} ranks\n", blas_summary(), world.size());
    fmt::print("emulated link: {:.4g} us, {:.4g} GB/s\n", o.link.latency_s * 1e6,
               o.link.bytes_per_s / 1e9);
    for (std::size_t r = 0; r < runs.size(); ++r) {
      fmt::print("  {:<28} {:9.2f} ms   (min {:.2f}, max {:.2f})\n", runs[r].label, median[r] * 1e3,
                 summary[r].min_s * 1e3, summary[r].max_s * 1e3);
    }
    fmt::print("pipelined / serial over the link: {:.2f}x\n", median[0] / median[1]);
    fmt::print(
        "serial schedule's exchanges over the link (with less without): {:.2f} ms, the rest "
        "{:.2f} ms\n",
        (median[1] - median[3]) * 1e3, median[3] * 1e3);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "owner_overlap: {}\n", e.what());
    return 1;
  }
}
