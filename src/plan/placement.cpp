// A model placed on a cluster: the parallelism spec, the rank layout and what each rank holds.
// See placement.h and docs/cost-model.md, "Placement and step simulation".
#include "distmuon/placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>

#include "distmuon/error.h"

namespace distmuon {
namespace {

constexpr int kMaxFactor = 1 << 20;  // far beyond any cluster

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

TpSplit split_of(std::string_view name) {
  if (ends_with(name, ".o") || ends_with(name, "fc2")) return TpSplit::kRow;
  if (ends_with(name, "q_a") || ends_with(name, "kv_a") || name == "router")
    return TpSplit::kReplicated;
  return TpSplit::kColumn;
}

Index divide_up(Index a, Index b) {
  return (a + b - 1) / b;
}

}  // namespace

OptimizerSharding parse_optimizer_sharding(std::string_view name) {
  if (name == "none") return OptimizerSharding::kNone;
  if (name == "zero1") return OptimizerSharding::kZero1;
  if (name == "layerwise") return OptimizerSharding::kLayerwise;
  throw Error(fmt::format("unknown optimizer sharding '{}' (none, zero1, layerwise)", name));
}

const char* to_string(OptimizerSharding s) {
  switch (s) {
    case OptimizerSharding::kNone:
      return "none";
    case OptimizerSharding::kZero1:
      return "zero1";
    case OptimizerSharding::kLayerwise:
      return "layerwise";
  }
  return "?";
}

std::string Parallelism::describe() const {
  std::string out;
  const auto add = [&](const char* key, int v, bool always = false) {
    if (v != 1 || always) out += fmt::format("{}{}={}", out.empty() ? "" : " ", key, v);
  };
  add("tp", tp);
  add("cp", cp);
  add("pp", pp);
  add("vpp", vpp);
  add("ep", ep);
  if (etp > 0) add("etp", etp, true);
  add("dp", dp, true);
  add("gtp", gtp);
  add("egtp", egtp);
  return out;
}

Parallelism parse_parallelism(std::string_view spec) {
  Parallelism p;
  const std::map<std::string_view, int*> fields = {
      {"tp", &p.tp}, {"cp", &p.cp},   {"pp", &p.pp},   {"vpp", &p.vpp},  {"dp", &p.dp},
      {"ep", &p.ep}, {"etp", &p.etp}, {"gtp", &p.gtp}, {"egtp", &p.egtp}};
  std::string names;
  for (const auto& [k, v] : fields)
    names += (names.empty() ? "" : ", ") + std::string(k);
  if (spec.empty()) throw Error("--parallel: empty (give e.g. tp=2,pp=4,dp=8)");
  std::map<std::string_view, bool> seen;
  while (!spec.empty()) {
    const auto comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos)
      throw Error(fmt::format("--parallel: '{}' is not name=value ({})", item, names));
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    const auto f = fields.find(key);
    if (f == fields.end())
      throw Error(fmt::format("--parallel: unknown name '{}' (one of {})", key, names));
    if (seen[key]) throw Error(fmt::format("--parallel: '{}' given twice", key));
    seen[key] = true;
    int v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc{} || end != value.data() + value.size() || v < 1 || v > kMaxFactor) {
      throw Error(fmt::format("--parallel: {}={} must be a whole number in [1, {}]", key, value,
                              kMaxFactor));
    }
    *f->second = v;
  }
  return p;
}

std::vector<LayeredWeight> layered_weights(const ModelPreset& model) {
  const Index dense = model.moe ? model.moe->dense_layers : model.layers;
  std::vector<LayeredWeight> out;
  for (const WeightShape& w : muon_weights(model)) {
    LayeredWeight l{w.name, w.m, w.n, 0, w.count, 0, split_of(w.name)};
    if (w.expert) {
      l.experts_per_layer = model.moe->experts;
      l.first_layer = dense;
      l.layers = w.count / model.moe->experts;
    } else if (w.name.starts_with("shared_expert") || w.name == "router") {
      l.first_layer = dense;
    }
    out.push_back(std::move(l));
  }
  return out;
}

std::vector<LayeredWeight> layered_weights(const std::vector<WeightShape>& weights) {
  std::vector<LayeredWeight> out;
  for (const WeightShape& w : weights) {
    if (w.expert)
      out.push_back({w.name, w.m, w.n, 0, 1, w.count, split_of(w.name)});
    else
      out.push_back({w.name, w.m, w.n, 0, w.count, 0, split_of(w.name)});
  }
  return out;
}

Placement::Placement(std::vector<LayeredWeight> weights, Parallelism par, int domain_size)
    : weights_(std::move(weights)), par_(par), domain_size_(domain_size) {
  const auto fail = [&](const std::string& why) {
    throw Error(fmt::format("placement {}: {}", par_.describe(), why));
  };
  for (int f : {par_.tp, par_.cp, par_.pp, par_.vpp, par_.dp, par_.ep, par_.expert_tp(), par_.gtp,
                par_.egtp}) {
    if (f < 1 || f > kMaxFactor) fail(fmt::format("every factor must be in [1, {}]", kMaxFactor));
  }
  if (static_cast<double>(par_.tp) * par_.cp * par_.pp * par_.dp > kMaxFactor)
    fail(fmt::format("more than {} ranks", kMaxFactor));
  if (domain_size_ < 1) fail("the NVLink domain size must be >= 1");
  if (weights_.empty()) fail("the model has no Muon weights");
  for (const LayeredWeight& w : weights_) {
    layers_ = std::max(layers_, w.first_layer + w.layers);
    if (w.expert()) {
      if (experts_ != 0 && experts_ != w.experts_per_layer)
        fail("the expert weights do not share one number of experts per layer");
      experts_ = w.experts_per_layer;
    }
  }
  const Index stages = Index{par_.pp} * par_.vpp;
  if (stages > layers_) fail(fmt::format("pp x vpp = {} stages for {} layers", stages, layers_));
  if (par_.dp % par_.gtp != 0) fail(fmt::format("gtp={} does not divide dp={}", par_.gtp, par_.dp));
  if (experts_ == 0 && (par_.ep != 1 || par_.egtp != 1))
    fail("ep and egtp need a model with experts");
  if (experts_ > 0) {
    if (experts_ % par_.ep != 0)
      fail(fmt::format("ep={} does not divide the {} experts of a layer", par_.ep, experts_));
    const int expert_block = par_.expert_tp() * par_.ep * par_.pp;
    if (world() % expert_block != 0) {
      fail(fmt::format("etp x ep x pp = {} does not divide the {} ranks (tp x cp x pp x dp)",
                       expert_block, world()));
    }
    if (par_.expert_dp() % par_.egtp != 0) {
      fail(fmt::format("egtp={} does not divide the expert data-parallel size {}", par_.egtp,
                       par_.expert_dp()));
    }
  }
  // Layers to virtual stages in order, the first L mod V stages one layer more; stage v on
  // pipeline rank v mod pp.
  layer_stage_.resize(static_cast<std::size_t>(layers_));
  const Index base = layers_ / stages, extra = layers_ % stages;
  Index layer = 0;
  for (Index v = 0; v < stages; ++v) {
    for (Index i = 0; i < base + (v < extra ? 1 : 0); ++i)
      layer_stage_[static_cast<std::size_t>(layer++)] = static_cast<int>(v % par_.pp);
  }
}

RankCoords Placement::coords(int rank) const {
  if (rank < 0 || rank >= world())
    throw Error(fmt::format("placement: rank {} outside [0, {})", rank, world()));
  RankCoords c;
  int rest = rank;
  c.tp = rest % par_.tp;
  rest /= par_.tp;
  c.cp = rest % par_.cp;
  rest /= par_.cp;
  c.dp = rest % par_.dp;
  c.pp = rest / par_.dp;
  c.gtp = c.dp % par_.gtp;
  if (experts_ > 0) {
    rest = rank;
    c.etp = rest % par_.expert_tp();
    rest /= par_.expert_tp();
    c.ep = rest % par_.ep;
    rest /= par_.ep;
    c.edp = rest % par_.expert_dp();
    c.egtp = c.edp % par_.egtp;
  }
  return c;
}

int Placement::stage_of_layer(Index layer) const {
  if (layer < 0 || layer >= layers_)
    throw Error(fmt::format("placement: layer {} outside [0, {})", layer, layers_));
  return layer_stage_[static_cast<std::size_t>(layer)];
}

std::vector<Index> Placement::stage_layers(int pp_rank) const {
  std::vector<Index> out;
  for (Index l = 0; l < layers_; ++l)
    if (layer_stage_[static_cast<std::size_t>(l)] == pp_rank) out.push_back(l);
  return out;
}

std::vector<int> Placement::dense_group(int rank, bool tp, bool gtp, bool replicas) const {
  const RankCoords c = coords(rank);
  const int g = par_.gtp, reps = par_.dp / g;
  std::vector<int> out;
  for (int t = tp ? 0 : c.tp; t < (tp ? par_.tp : c.tp + 1); ++t) {
    for (int x = replicas ? 0 : c.cp; x < (replicas ? par_.cp : c.cp + 1); ++x) {
      for (int r = replicas ? 0 : c.dp / g; r < (replicas ? reps : c.dp / g + 1); ++r) {
        for (int s = gtp ? 0 : c.gtp; s < (gtp ? g : c.gtp + 1); ++s)
          out.push_back(t + par_.tp * (x + par_.cp * (s + g * r + par_.dp * c.pp)));
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> Placement::expert_group(int rank, bool tp, bool gtp, bool replicas) const {
  const RankCoords c = coords(rank);
  const int etp = par_.expert_tp(), edp = par_.expert_dp(), g = par_.egtp, reps = edp / g;
  std::vector<int> out;
  for (int t = tp ? 0 : c.etp; t < (tp ? etp : c.etp + 1); ++t) {
    for (int r = replicas ? 0 : c.edp / g; r < (replicas ? reps : c.edp / g + 1); ++r) {
      for (int s = gtp ? 0 : c.egtp; s < (gtp ? g : c.egtp + 1); ++s)
        out.push_back(t + etp * (c.ep + par_.ep * (s + g * r + edp * c.pp)));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> Placement::shard_group(int rank, bool expert, bool tp_replicated) const {
  // The same coordinates but the tp (etp) and gtp (egtp) ones.
  return expert ? expert_group(rank, true, true, false)
                : dense_group(rank, !tp_replicated, true, false);
}

std::vector<int> Placement::replica_group(int rank, bool expert, bool tp_replicated) const {
  return expert ? expert_group(rank, false, false, true)
                : dense_group(rank, tp_replicated, false, true);
}

bool Placement::crosses_domain(const std::vector<int>& ranks) const {
  if (ranks.empty()) return false;
  const int first = ranks.front() / domain_size_;
  return std::any_of(ranks.begin(), ranks.end(), [&](int r) { return r / domain_size_ != first; });
}

std::vector<HeldWeight> Placement::rank_weights(int rank) const {
  const RankCoords c = coords(rank);
  // Group crossings: dense (TP-split or not) and expert, computed once.
  const bool dense_shard = crosses_domain(shard_group(rank, false));
  const bool dense_replicas = crosses_domain(replica_group(rank, false));
  const bool dense_replicas_all = crosses_domain(replica_group(rank, false, true));
  const bool dense_gtp = crosses_domain(shard_group(rank, false, true));
  bool expert_shard = false, expert_replicas = false;
  if (experts_ > 0) {
    expert_shard = crosses_domain(shard_group(rank, true));
    expert_replicas = crosses_domain(replica_group(rank, true));
  }
  std::vector<HeldWeight> out;
  for (const Index layer : stage_layers(c.pp)) {
    for (const LayeredWeight& w : weights_) {
      if (layer < w.first_layer || layer >= w.first_layer + w.layers) continue;
      HeldWeight h;
      h.name = w.name;
      h.layer = layer;
      h.m = w.m;
      h.n = w.n;
      h.tp_dim = w.split == TpSplit::kRow ? 1 : 0;
      if (w.expert()) {
        h.experts = w.experts_per_layer / par_.ep;
        h.first_expert = c.ep * h.experts;
        h.tp = par_.expert_tp();
        h.gtp = par_.egtp;
        h.replicas = par_.expert_dp() / par_.egtp;
        h.shard_crosses = expert_shard;
        h.replicas_cross = expert_replicas;
      } else {
        const bool replicated = w.split == TpSplit::kReplicated;
        h.tp = replicated ? 1 : par_.tp;
        h.gtp = par_.gtp;
        h.replicas = par_.cp * (par_.dp / par_.gtp) * (replicated ? par_.tp : 1);
        // A weight TP does not split has the gtp ranks alone as its shard group.
        h.shard_crosses = replicated ? dense_gtp : dense_shard;
        h.replicas_cross = replicated ? dense_replicas_all : dense_replicas;
      }
      const Index rows = h.tp_dim == 0 ? divide_up(w.m, h.tp) : w.m;
      h.shard_m = divide_up(rows, h.gtp);
      h.shard_n = h.tp_dim == 1 ? divide_up(w.n, h.tp) : w.n;
      out.push_back(std::move(h));
    }
  }
  return out;
}

}  // namespace distmuon
