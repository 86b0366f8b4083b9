// The step simulation as a table and as JSON (what `distmuon plan --parallel` prints).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "distmuon/step_simulation.h"

namespace distmuon {
namespace {

std::string gib(double bytes) {
  return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024));
}

nlohmann::json class_json(const ClassStep& c) {
  return {{"seconds", c.seconds},
          {"ns_seconds", c.ns_s},
          {"comm_seconds", c.comm_s},
          {"exposed_comm_seconds", c.exposed_comm_s()},
          {"weights", c.weights}};
}

}  // namespace

std::string format_simulation(const StepSimulation& sim) {
  const SimulationOptions& o = sim.options;
  const Parallelism& p = sim.parallelism;
  std::string out = fmt::format(
      "placement: {} on {} ranks, NVLink domains of {} ranks; optimizer state: {} over the "
      "data-parallel replicas\n",
      p.describe(), p.world(), sim.domain_size, to_string(p.sharding));
  out += fmt::format("NS: {}, {} steps, {}, algorithm {}; profile {}; {} bucket(s){}; experts {}\n",
                     o.elem_size == 2 ? "bf16" : "fp32", o.steps, o.use_syrk ? "syrk" : "gemm",
                     to_string(o.algorithm), o.profile.name, o.buckets,
                     o.buckets == 1 ? " (serial)" : " (pipelined)",
                     o.batch_experts ? "batched per layer" : "one by one");
  const bool link = o.link.latency_s > 0 || o.link.bytes_per_s > 0;
  if (o.wire_elem_size != 4 || link) {
    out += fmt::format("replicated-home's wire: {}", o.wire_elem_size == 2 ? "bf16" : "fp32");
    if (link) {
      out += fmt::format(
          "; owner's and replicated-home's exchanges over an emulated link of {:.4g} "
          "us, {:.4g} GB/s",
          o.link.latency_s * 1e6, o.link.bytes_per_s / 1e9);
    }
    out += "\n";
  }
  out += fmt::format("Muon weights: {:.4g} elements\n", sim.parameters);
  out += fmt::format("  {:<16} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>8} {:>12}\n", "mode",
                     "step_ms", "ns_ms", "comm_ms", "exposed_ms", "dense_ms", "expert_ms",
                     "busiest", "workspace");
  for (const ModeStep& m : sim.modes) {
    const RankStep& r = m.step();
    out += fmt::format(
        "  {:<16} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.2f} {:>10.2f} {:>10.2f} {:>8} {:>12}\n",
        to_string(m.mode), 1e3 * r.seconds(), 1e3 * r.ns_s(), 1e3 * r.comm_s(),
        1e3 * (r.dense.exposed_comm_s() + r.expert.exposed_comm_s()), 1e3 * r.dense.seconds,
        1e3 * r.expert.seconds, r.rank, gib(m.workspace_bytes));
  }
  const ModeStep& a = sim.of(StepMode::kAuto);
  out += fmt::format("auto: dense weights {}", to_string(a.dense_choice));
  if (sim.has_experts) out += fmt::format(", expert weights {}", to_string(a.expert_choice));
  out += fmt::format(" ({:.2f}x faster than duplicated)\n",
                     sim.of(StepMode::kDuplicated).seconds() / a.seconds());
  out += fmt::format("optimizer state: Muon momentum (fp32) {} per rank (the busiest)\n",
                     gib(sim.momentum_bytes));
  return out;
}

void to_json(nlohmann::json& j, const StepSimulation& sim) {
  const SimulationOptions& o = sim.options;
  const Parallelism& p = sim.parallelism;
  j = nlohmann::json{{"parallel",
                      {{"tp", p.tp},
                       {"cp", p.cp},
                       {"pp", p.pp},
                       {"vpp", p.vpp},
                       {"dp", p.dp},
                       {"ep", p.ep},
                       {"etp", p.expert_tp()},
                       {"edp", p.expert_dp()},
                       {"gtp", p.gtp},
                       {"egtp", p.egtp},
                       {"world", p.world()},
                       {"optimizer_sharding", to_string(p.sharding)}}},
                     {"domain_size", sim.domain_size},
                     {"options",
                      {{"profile", o.profile.name},
                       {"elem_size", o.elem_size},
                       {"steps", o.steps},
                       {"syrk", o.use_syrk},
                       {"algorithm", to_string(o.algorithm)},
                       {"buckets", o.buckets},
                       {"batch_experts", o.batch_experts},
                       {"wire_elem_size", o.wire_elem_size}}},
                     {"muon_elements", sim.parameters},
                     {"momentum_bytes_per_rank", sim.momentum_bytes},
                     {"units", "seconds"}};
  if (o.link.latency_s > 0 || o.link.bytes_per_s > 0) {
    j["options"]["link_latency_us"] = o.link.latency_s * 1e6;
    j["options"]["link_gbps"] = o.link.bytes_per_s / 1e9;
  }
  nlohmann::json modes = nlohmann::json::object();
  for (const ModeStep& m : sim.modes) {
    const RankStep& r = m.step();
    nlohmann::json e = {{"seconds", r.seconds()},
                        {"ns_seconds", r.ns_s()},
                        {"comm_seconds", r.comm_s()},
                        {"busiest_rank", r.rank},
                        {"dense", class_json(r.dense)},
                        {"expert", class_json(r.expert)},
                        {"workspace_bytes", m.workspace_bytes}};
    if (m.mode == StepMode::kAuto) {
      e["dense_choice"] = to_string(m.dense_choice);
      e["expert_choice"] = to_string(m.expert_choice);
    }
    modes[to_string(m.mode)] = std::move(e);
  }
  j["modes"] = std::move(modes);
}

std::string format_rank(const Placement& placement, const SimulationOptions& options, int rank) {
  const RankCoords c = placement.coords(rank);
  std::string out = fmt::format(
      "rank {} of {}: tp {}, cp {}, dp {} (gtp {}), pp {}; experts: etp {}, ep {}, edp {} (egtp "
      "{})\n",
      rank, placement.world(), c.tp, c.cp, c.dp, c.gtp, c.pp, c.etp, c.ep, c.edp, c.egtp);
  out +=
      fmt::format("  {:<6} {:<18} {:>9} {:>12} {:>12} {:>8} {:>4} {:>9}  {}\n", "layer", "weight",
                  "experts", "full", "shard", "tp split", "gtp", "replicas", "crosses a domain");
  for (const HeldWeight& w : placement.rank_weights(rank)) {
    out += fmt::format(
        "  {:<6} {:<18} {:>9} {:>12} {:>12} {:>8} {:>4} {:>9}  {}\n", w.layer, w.name,
        w.expert() ? fmt::format("{}-{}", w.first_expert, w.first_expert + w.experts - 1) : "-",
        fmt::format("{}x{}", w.m, w.n), fmt::format("{}x{}", w.shard_m, w.shard_n),
        w.tp > 1 ? fmt::format("{} dim {}", w.tp, w.tp_dim) : "-", w.gtp, w.replicas,
        w.shard_crosses && w.replicas_cross ? "shard group, replicas"
        : w.shard_crosses                   ? "shard group"
        : w.replicas_cross                  ? "replicas"
                                            : "-");
  }
  out +=
      "Muon work per mode (NS of the whole matrix here, its shard of a distributed NS, or run "
      "at another rank; experts counted one by one):\n";
  for (const StepMode mode : kStepModes) {
    if (mode == StepMode::kAuto) continue;
    Index whole = 0, shard = 0, elsewhere = 0;
    std::string here;
    int listed = 0;
    constexpr int kListed = 12;  // weights named per mode; the rest counted
    for (const RankWork& r : rank_work(placement, options, rank, mode)) {
      const Index n = r.experts > 0 ? r.experts : 1;
      if (r.work == NsWork::kElsewhere) {
        elsewhere += n;
        continue;
      }
      (r.work == NsWork::kWhole ? whole : shard) += n;
      if ((mode == StepMode::kOwner || mode == StepMode::kReplicatedHome) && listed++ < kListed) {
        here += fmt::format("{}{} L{}{}", here.empty() ? "" : ", ", r.name, r.layer,
                            r.expert >= 0 ? fmt::format(" e{}", r.expert) : "");
      }
    }
    out += fmt::format("  {:<16} {} whole, {} shard, {} elsewhere\n", to_string(mode), whole, shard,
                       elsewhere);
    if (!here.empty() && elsewhere > 0) {
      out += fmt::format("    here: {}{}\n", here,
                         listed > kListed ? fmt::format(" and {} more", listed - kListed) : "");
    }
  }
  return out;
}

}  // namespace distmuon
