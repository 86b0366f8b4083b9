// tp_mode=auto by measurement (measure_plan.h): the candidates rank 0 picks from the model and the
// wisdom, the interleaved timed rounds on every rank, and rank 0's decision from the timings.
#include "distmuon/measure_plan.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/memory_check.h"
#include "distmuon/timing.h"
#include "distmuon/wisdom.h"
#include "plan/candidate_runner.h"
#include "plan/plan_names.h"

namespace distmuon {

void to_json(nlohmann::json& j, const AutoKey& k);  // checkpoint.cpp

namespace {

using nlohmann::json;

// The distinct keys in order of first appearance, and each weight's.
struct Distinct {
  std::vector<AutoKey> keys;
  std::vector<std::size_t> first;      // per distinct key: its first weight
  std::vector<std::size_t> of_weight;  // per weight: its distinct key
};

Distinct distinct_keys(std::span<const AutoKey> keys) {
  Distinct d;
  for (std::size_t w = 0; w < keys.size(); ++w) {
    const auto it = std::find(d.keys.begin(), d.keys.end(), keys[w]);
    if (it == d.keys.end()) {
      d.of_weight.push_back(d.keys.size());
      d.keys.push_back(keys[w]);
      d.first.push_back(w);
    } else {
      d.of_weight.push_back(static_cast<std::size_t>(it - d.keys.begin()));
    }
  }
  return d;
}

// Rank-local checks of the inputs ("" when they hold).
std::string check_inputs(std::span<const AutoKey> keys,
                         std::span<const std::vector<std::size_t>> buckets,
                         const MeasurePlanOptions& options) {
  try {
    options.validate();
    for (const AutoKey& k : keys)
      validate_key(k);
  } catch (const Error& e) {
    return e.what();
  }
  std::vector<int> seen(keys.size(), 0);
  for (const std::vector<std::size_t>& b : buckets) {
    if (b.empty()) return "an empty bucket";
    for (const std::size_t w : b) {
      if (w >= keys.size()) return fmt::format("bucket weight {} of {} weights", w, keys.size());
      ++seen[w];
    }
  }
  if (std::any_of(seen.begin(), seen.end(), [](int n) { return n != 1; }))
    return "every weight must be in exactly one bucket";
  return {};
}

// The keys and buckets as text (every rank must plan the same).
std::string inputs_text(std::span<const AutoKey> keys,
                        std::span<const std::vector<std::size_t>> buckets) {
  json j = {{"keys", json::array()}, {"buckets", buckets}};
  for (const AutoKey& k : keys)
    j["keys"].push_back(k);
  return j.dump();
}

// The per-weight candidates of a key the model ranks best: within options.within of the best
// estimate, at most options.top, best first.
std::vector<AutoChoice> weight_candidates(const AutoKey& key, const CostEstimate& e,
                                          const MeasurePlanOptions& options) {
  std::vector<std::pair<double, AutoChoice>> all;
  for (TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed}) {
    for (NsAlgorithm a : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
      const bool priced = a == NsAlgorithm::kStandard || e.prices_gram;
      if (priced && (auto_key_allows(key, a) || !e.prices_gram))
        all.push_back({e.cost(mode, a), {mode, a}});
    }
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<AutoChoice> out;
  for (const auto& [cost, choice] : all) {
    if (out.size() < static_cast<std::size_t>(options.top) &&
        (out.empty() || cost <= options.within * all.front().first))
      out.push_back(choice);
  }
  return out;
}

// Owner runs of a bucket worth timing: the model's per-weight algorithms, and all-standard and
// all-Gram when the key allows them, within options.within of the best owner estimate, at most 2.
std::vector<std::vector<NsAlgorithm>> owner_candidates(std::span<const AutoKey> keys,
                                                       std::span<const CostEstimate> estimates,
                                                       const HardwareProfile* profile,
                                                       const MeasurePlanOptions& options) {
  const AutoKey& first = keys.front();
  const bool priced = std::all_of(estimates.begin(), estimates.end(),
                                  [](const CostEstimate& e) { return e.prices_gram; });
  if (!priced || first.group_size * first.second_group_size < 2) return {};
  std::vector<std::pair<double, std::vector<NsAlgorithm>>> runs;
  const OwnerBucketEstimate mix = estimate_owner_bucket(keys, estimates, profile);
  runs.push_back({mix.cost(), mix.algorithms});
  for (NsAlgorithm a : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    if (!std::all_of(keys.begin(), keys.end(),
                     [&](const AutoKey& k) { return auto_key_allows(k, a); }))
      continue;
    const std::vector<NsAlgorithm> all(keys.size(), a);
    if (all == mix.algorithms) continue;
    std::vector<AutoKey> pinned(keys.begin(), keys.end());
    for (AutoKey& k : pinned)
      k.algorithm = a;
    runs.push_back({estimate_owner_bucket(pinned, estimates, profile).cost(), all});
  }
  std::stable_sort(runs.begin(), runs.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::vector<NsAlgorithm>> out;
  for (const auto& [cost, algorithms] : runs) {
    if (out.size() < 2 && cost <= options.within * runs.front().first) out.push_back(algorithms);
  }
  return out;
}

json codes_of(std::span<const NsAlgorithm> algorithms) {
  json j = json::array();
  for (NsAlgorithm a : algorithms)
    j.push_back(static_cast<int>(a));
  return j;
}

std::vector<NsAlgorithm> algorithms_of(const json& j) {
  std::vector<NsAlgorithm> out;
  for (const json& a : j)
    out.push_back(static_cast<NsAlgorithm>(a.get<int>()));
  return out;
}

std::string ms(double seconds) {
  return fmt::format("{:.4g} ms", seconds * 1e3);
}

// Rank 0's state between choosing the candidates and deciding.
struct Root {
  std::optional<Wisdom> wisdom;
  std::vector<std::optional<std::vector<MeasuredCandidate>>> known_keys;  // from wisdom
  std::vector<std::optional<std::vector<MeasuredOwner>>> known_owner;
  std::vector<std::vector<AutoKey>> bucket_keys;
};

// Rank 0: the candidates to time (JSON: per distinct key a list of choice codes, per bucket a
// list of owner runs' algorithm codes; empty when the wisdom has them or owner is not priced).
std::string choose_candidates(Root& root, const Distinct& d, std::span<const AutoKey> keys,
                              std::span<const std::vector<std::size_t>> buckets,
                              const AutoModeResolver& resolver, const MeasurePlanOptions& options,
                              const MeasureTarget& target) {
  const HardwareProfile* profile = resolver.profile() ? &*resolver.profile() : nullptr;
  if (!options.wisdom.empty()) {
    // Before any timing: the file is written only after it.
    check_output_file(options.wisdom, "wisdom file");
    WisdomContext context{this_host(), profile ? profile->name : "none",
                          to_string(resolver.cost_model()), target.device()};
    root.wisdom = Wisdom::load(options.wisdom, std::move(context));
    if (root.wisdom->foreign() > 0) {
      spdlog::info("tp_mode=auto: {} entr(ies) of wisdom file {} are from another {}: ignored",
                   root.wisdom->foreign(), options.wisdom, root.wisdom->foreign_reasons().front());
    }
  }
  json program = {{"keys", json::array()}, {"buckets", json::array()}};
  std::vector<CostEstimate> estimates;
  for (const AutoKey& k : d.keys) {
    estimates.push_back(estimate(k, profile, resolver.cost_model()));
    const auto* known = root.wisdom ? root.wisdom->find(k) : nullptr;
    root.known_keys.push_back(known ? std::optional(*known) : std::nullopt);
    json codes = json::array();
    if (!known) {
      for (const AutoChoice& c : weight_candidates(k, estimates.back(), options))
        codes.push_back(to_code(c));
    }
    program["keys"].push_back(codes);
  }
  for (const std::vector<std::size_t>& b : buckets) {
    std::vector<AutoKey> bk;
    std::vector<CostEstimate> be;
    for (const std::size_t w : b) {
      bk.push_back(keys[w]);
      be.push_back(estimates[d.of_weight[w]]);
    }
    const auto* known = root.wisdom ? root.wisdom->find_owner(bk) : nullptr;
    root.known_owner.push_back(known ? std::optional(*known) : std::nullopt);
    json runs = json::array();
    if (!known) {
      for (const auto& algorithms : owner_candidates(bk, be, profile, options))
        runs.push_back(codes_of(algorithms));
    }
    program["buckets"].push_back(runs);
    root.bucket_keys.push_back(std::move(bk));
  }
  return program.dump();
}

template <typename T>
void sort_by_time(std::vector<T>& v) {
  std::stable_sort(v.begin(), v.end(),
                   [](const T& a, const T& b) { return a.seconds < b.seconds; });
}

// Rank 0: the plan from the measured medians (the same on every rank) and the wisdom; records
// and writes the new times. JSON: per distinct key its candidates, per bucket its owner runs and
// decision, per weight its choice.
std::string decide(Root& root, const Distinct& d, std::span<const std::vector<std::size_t>> buckets,
                   const json& program, const std::vector<double>& medians,
                   const MeasurePlanOptions& options) {
  std::size_t at = 0;
  std::vector<std::vector<MeasuredCandidate>> per_key(d.keys.size());
  bool fresh = false;
  for (std::size_t k = 0; k < d.keys.size(); ++k) {
    if (root.known_keys[k]) {
      per_key[k] = *root.known_keys[k];
    } else {
      for (const json& code : program["keys"][k])
        per_key[k].push_back({choice_from_code(code.get<std::int64_t>()), medians.at(at++)});
      sort_by_time(per_key[k]);
      if (root.wisdom) root.wisdom->record(d.keys[k], per_key[k]);
      fresh = true;
    }
    sort_by_time(per_key[k]);
    std::vector<std::string> parts;
    for (const MeasuredCandidate& c : per_key[k])
      parts.push_back(fmt::format("{} {}", to_string(c.choice), ms(c.seconds)));
    spdlog::info("tp_mode=auto (measured{}): {} -> {} {} ({})",
                 root.known_keys[k] ? ", from wisdom" : "", describe(d.keys[k]),
                 to_string(per_key[k].front().choice), ms(per_key[k].front().seconds),
                 fmt::join(parts, ", "));
  }
  json out = {{"keys", json::array()}, {"buckets", json::array()}};
  for (const auto& list : per_key) {
    json j = json::array();
    for (const MeasuredCandidate& c : list)
      j.push_back({to_code(c.choice), c.seconds});
    out["keys"].push_back(j);
  }
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::vector<MeasuredOwner> runs;
    if (root.known_owner[b]) {
      runs = *root.known_owner[b];
    } else {
      for (const json& algorithms : program["buckets"][b])
        runs.push_back({algorithms_of(algorithms), medians.at(at++)});
      sort_by_time(runs);
      if (root.wisdom && !runs.empty()) root.wisdom->record_owner(root.bucket_keys[b], runs);
      fresh = fresh || !runs.empty();
    }
    sort_by_time(runs);
    double per_weight = 0;
    for (const std::size_t w : buckets[b])
      per_weight += per_key[d.of_weight[w]].front().seconds;
    const bool owner = !runs.empty() && runs.front().seconds < per_weight;
    json j = {{"owner", json::array()},
              {"chose_owner", owner},
              {"seconds", owner ? runs.front().seconds : per_weight}};
    for (const MeasuredOwner& r : runs)
      j["owner"].push_back({codes_of(r.algorithms), r.seconds});
    out["buckets"].push_back(j);
    if (!runs.empty()) {
      spdlog::info(
          "tp_mode=auto (measured{}): bucket of {} weight(s) -> {} {} (fastest owner run {}; best "
          "per weight {})",
          root.known_owner[b] ? ", from wisdom" : "", buckets[b].size(),
          owner ? "owner" : "per-weight choices", ms(j["seconds"].get<double>()),
          ms(runs.front().seconds), ms(per_weight));
    }
  }
  if (root.wisdom && fresh) root.wisdom->save(options.wisdom);
  return out.dump();
}

}  // namespace

PlanMode parse_plan_mode(std::string_view name) {
  return detail::parse_enum<PlanMode>(name, "plan mode");
}

const char* to_string(PlanMode mode) {
  return detail::name_of(mode);
}

void MeasurePlanOptions::validate() const {
  if (warmup < 0 || reps < 1 || top < 1 || !(within >= 1.0)) {
    throw Error(fmt::format(
        "measure plan options: warm-up {} (>= 0), reps {} (>= 1), top {} (>= 1), within {} "
        "(>= 1)",
        warmup, reps, top, within));
  }
}

MeasuredPlan plan_by_measuring(const Communicator& world, std::span<const AutoKey> keys,
                               std::span<const std::vector<std::size_t>> buckets,
                               MeasureTarget& target, const AutoModeResolver& resolver,
                               const MeasurePlanOptions& options) {
  const std::string why = check_inputs(keys, buckets, options);
  agree_or_throw(world, why.empty(), "tp_mode=auto (measure)", why);
  agree_on(world, inputs_text(keys, buckets), "tp_mode=auto (measure): the weights and buckets");

  const Distinct d = distinct_keys(keys);
  Root root;
  const json program =
      json::parse(decide_on_root<std::string>(world, 0, "tp_mode=auto (measure)", [&] {
        return choose_candidates(root, d, keys, buckets, resolver, options, target);
      }));

  // Every candidate of the program, in program order, timed in interleaved rounds. The tasks are
  // built (their scratch allocated) only after the memory check, and every rank agrees that they
  // were before any is timed.
  std::vector<MeasureTask> tasks;
  std::string failed;
  try {
    std::vector<std::size_t> weights;
    for (std::size_t k = 0; k < d.keys.size(); ++k) {
      if (!program["keys"][k].empty()) weights.push_back(d.first[k]);
    }
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      if (!program["buckets"][b].empty())
        weights.insert(weights.end(), buckets[b].begin(), buckets[b].end());
    }
    std::sort(weights.begin(), weights.end());
    weights.erase(std::unique(weights.begin(), weights.end()), weights.end());
    check_memory_fits(target.scratch_bytes(weights), "tp_mode=auto (measure): the timed copies");
    for (std::size_t k = 0; k < d.keys.size(); ++k) {
      for (const json& code : program["keys"][k])
        tasks.push_back(target.weight_task(d.first[k], choice_from_code(code.get<std::int64_t>())));
    }
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      for (const json& algorithms : program["buckets"][b])
        tasks.push_back(target.owner_task(b, algorithms_of(algorithms)));
    }
  } catch (const std::exception& e) {
    failed = e.what();
    tasks.clear();
  }
  agree_or_throw(world, failed.empty(), "tp_mode=auto (measure): preparing the candidates", failed);

  MeasuredPlan plan;
  if (!tasks.empty() && world.rank() == 0) {
    spdlog::info("tp_mode=auto: timing {} candidate(s), {} warm-up and {} timed round(s)",
                 tasks.size(), options.warmup, options.reps);
  }
  // A run or reset that throws on some ranks ends every rank with its message
  // (candidate_runner.h): a failing candidate ends the plan, it is not skipped.
  std::vector<std::vector<double>> samples = detail::run_candidates(
      world, tasks, {options.warmup, options.reps, "tp_mode=auto (measure)", {}});
  plan.timed_runs = static_cast<std::size_t>(options.warmup + options.reps) * tasks.size();
  std::vector<double> medians;
  for (std::vector<double>& s : samples)
    medians.push_back(summarize(std::move(s)).median_s);

  const json decision =
      json::parse(decide_on_root<std::string>(world, 0, "tp_mode=auto (measure)", [&] {
        return decide(root, d, buckets, program, medians, options);
      }));
  std::vector<std::vector<MeasuredCandidate>> per_key;
  for (const json& list : decision["keys"]) {
    per_key.emplace_back();
    for (const json& c : list)
      per_key.back().push_back({choice_from_code(c[0].get<std::int64_t>()), c[1].get<double>()});
  }
  plan.choices.resize(keys.size());
  for (std::size_t w = 0; w < keys.size(); ++w) {
    plan.candidates.push_back(per_key[d.of_weight[w]]);
    plan.choices[w] = per_key[d.of_weight[w]].front().choice;
  }
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const json& j = decision["buckets"][b];
    plan.owner.emplace_back();
    for (const json& r : j["owner"])
      plan.owner.back().push_back({algorithms_of(r[0]), r[1].get<double>()});
    plan.chose_owner.push_back(j["chose_owner"].get<bool>());
    plan.bucket_seconds.push_back(j["seconds"].get<double>());
    if (plan.chose_owner.back()) {
      for (std::size_t i = 0; i < buckets[b].size(); ++i)
        plan.choices[buckets[b][i]] = {TpMode::kOwner, plan.owner.back().front().algorithms[i]};
    }
  }
  for (std::size_t k = 0; k < d.keys.size(); ++k)
    plan.wisdom_hits += program["keys"][k].empty() ? 1 : 0;
  for (std::size_t b = 0; b < buckets.size(); ++b)
    plan.wisdom_hits += program["buckets"][b].empty() && !plan.owner[b].empty() ? 1 : 0;
  return plan;
}

}  // namespace distmuon
