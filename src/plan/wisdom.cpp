// Wisdom files of tp_mode=auto's measure mode: the host's identity, reading (with the entries of
// other contexts set aside), lookups and the atomic write.
#include "distmuon/wisdom.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/host.h"
#include "distmuon/blas_info.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"

namespace distmuon {

// The AutoKey JSON of checkpoints (checkpoint.cpp): wisdom and checkpoints spell keys alike.
void to_json(nlohmann::json& j, const AutoKey& k);
void from_json(const nlohmann::json& j, AutoKey& k);

namespace {

using nlohmann::json;

constexpr const char* kFormat = "distmuon wisdom";
constexpr int kVersion = 1;

json host_json(const HostIdentity& h) {
  return {{"hostname", h.hostname},
          {"cpu", h.cpu},
          {"blas_core", h.blas_core},
          {"blas_threads", h.blas_threads}};
}

HostIdentity host_from(const json& j) {
  return {j.at("hostname").get<std::string>(), j.at("cpu").get<std::string>(),
          j.at("blas_core").get<std::string>(), j.at("blas_threads").get<int>()};
}

double checked_ms(const json& j) {
  const double ms = j.at("ms").get<double>();
  if (!std::isfinite(ms) || ms <= 0) throw Error(fmt::format("time {} ms is not positive", ms));
  return ms;
}

json context_json(const WisdomContext& c) {
  return {{"host", host_json(c.host)},
          {"profile", c.profile},
          {"cost_model", c.cost_model},
          {"device", c.device}};
}

// Why an entry of context `theirs` does not apply here ("" when it does).
std::string mismatch(const WisdomContext& mine, const WisdomContext& theirs) {
  if (theirs.host != mine.host) return fmt::format("host {}", describe(theirs.host));
  if (theirs.profile != mine.profile) return fmt::format("profile {}", theirs.profile);
  if (theirs.cost_model != mine.cost_model) return fmt::format("cost model {}", theirs.cost_model);
  if (theirs.device != mine.device) return fmt::format("device {}", theirs.device);
  return {};
}

// Whether a key lets the planner time algorithm a (measure_plan.cpp): what the key allows, and
// the standard algorithm of a Gram-pinned key under a cost model that prices no Gram (the
// reference model: the planner falls back to standard).
bool allowed(const AutoKey& key, NsAlgorithm a, const std::string& cost_model) {
  if (a == NsAlgorithm::kAuto) return false;
  if (key.algorithm == NsAlgorithm::kAuto || key.algorithm == a) return true;
  return a == NsAlgorithm::kStandard && cost_model == "reference";
}

std::vector<MeasuredCandidate> candidates_from(const json& list, const AutoKey& key,
                                               const std::string& cost_model) {
  std::vector<MeasuredCandidate> out;
  for (const json& c : list.at("candidates")) {
    const AutoChoice choice{parse_tp_mode(c.at("mode").get<std::string>()),
                            parse_ns_algorithm(c.at("algorithm").get<std::string>())};
    if ((choice.mode != TpMode::kDuplicated && choice.mode != TpMode::kDistributed) ||
        choice.algorithm == NsAlgorithm::kAuto) {
      throw Error(
          fmt::format("candidate '{}' is not a per-weight mode and algorithm", to_string(choice)));
    }
    if (!allowed(key, choice.algorithm, cost_model)) {
      throw Error(fmt::format("candidate '{}' uses an algorithm its key ({}) does not allow",
                              to_string(choice), to_string(key.algorithm)));
    }
    out.push_back({choice, checked_ms(c) * 1e-3});
  }
  if (out.empty()) throw Error("an entry without candidates");
  return out;
}

std::vector<MeasuredOwner> owner_from(const json& list, std::span<const AutoKey> keys) {
  std::vector<MeasuredOwner> out;
  for (const json& o : list.at("owner")) {
    MeasuredOwner run;
    for (const json& a : o.at("algorithms"))
      run.algorithms.push_back(parse_ns_algorithm(a.get<std::string>()));
    if (run.algorithms.size() != keys.size()) {
      throw Error(fmt::format("an owner run with {} algorithms for a bucket of {} weights",
                              run.algorithms.size(), keys.size()));
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      // Owner runs are only timed where the model prices Gram: the key must allow the algorithm.
      const NsAlgorithm a = run.algorithms[i];
      if (a == NsAlgorithm::kAuto ||
          !(keys[i].algorithm == NsAlgorithm::kAuto || keys[i].algorithm == a)) {
        throw Error(
            fmt::format("owner run algorithm '{}' of weight {} is not one its key ({}) allows",
                        to_string(a), i, to_string(keys[i].algorithm)));
      }
    }
    run.seconds = checked_ms(o) * 1e-3;
    out.push_back(std::move(run));
  }
  if (out.empty()) throw Error("an entry without owner runs");
  return out;
}

}  // namespace

HostIdentity this_host() {
  std::string name;
  try {
    name = detail::host_name();
  } catch (const Error& e) {
    throw Error(fmt::format("wisdom: {}", e.what()));
  }
  return {std::move(name), detail::cpu_model(), blas_core(), blas_threads()};
}

std::string describe(const HostIdentity& h) {
  return fmt::format("{} ({}, BLAS {}, {} thread(s))", h.hostname, h.cpu, h.blas_core,
                     h.blas_threads);
}

Wisdom Wisdom::load(const std::filesystem::path& path, WisdomContext context) {
  Wisdom w(std::move(context));
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (ec) throw Error(fmt::format("wisdom file '{}': {}", path.string(), ec.message()));
    return w;
  }
  json doc;
  try {
    doc = read_json_file(path);
  } catch (const Error& e) {
    throw Error(fmt::format("wisdom: {}; delete it or name another file", e.what()));
  }
  std::size_t at = 0;
  try {
    if (!doc.is_object() || doc.value("format", "") != kFormat)
      throw Error(fmt::format("no \"format\": \"{}\" field", kFormat));
    if (doc.at("version").get<int>() != kVersion) {
      throw Error(fmt::format("version {} (this distmuon reads version {})",
                              doc.at("version").dump(), kVersion));
    }
    for (const json& e : doc.at("entries")) {
      const WisdomContext theirs{host_from(e.at("host")), e.at("profile").get<std::string>(),
                                 e.at("cost_model").get<std::string>(),
                                 e.value("device", std::string("cpu-openblas"))};
      const bool is_key = e.contains("key");
      if (is_key == e.contains("bucket"))
        throw Error("an entry needs exactly one of \"key\" and \"bucket\"");
      std::vector<AutoKey> keys;
      if (is_key) {
        keys.push_back(e.at("key").get<AutoKey>());
      } else {
        keys = e.at("bucket").get<std::vector<AutoKey>>();
        if (keys.empty()) throw Error("an empty bucket");
      }
      for (const AutoKey& k : keys)
        validate_key(k);
      // Parsed even when foreign, so that a damaged entry is reported whoever wrote it.
      auto candidates = is_key ? candidates_from(e, keys.front(), theirs.cost_model)
                               : std::vector<MeasuredCandidate>{};
      auto owner = is_key ? std::vector<MeasuredOwner>{} : owner_from(e, keys);
      if (const std::string why = mismatch(w.context_, theirs); !why.empty()) {
        w.foreign_.push_back(e.dump());
        w.foreign_reasons_.push_back(why);
      } else if (is_key) {
        w.keys_.insert_or_assign(keys.front(), std::move(candidates));
      } else {
        w.buckets_.insert_or_assign(std::move(keys), std::move(owner));
      }
      ++at;
    }
  } catch (const std::exception& e) {
    throw Error(fmt::format(
        "wisdom file '{}' is not valid distmuon wisdom (entry {}): {}; delete it or name "
        "another file",
        path.string(), at, e.what()));
  }
  return w;
}

void Wisdom::save(const std::filesystem::path& path) const {
  json entries = json::array();
  for (const std::string& e : foreign_)
    entries.push_back(json::parse(e));
  for (const auto& [key, candidates] : keys_) {
    json e = context_json(context_);
    e["key"] = key;
    e["candidates"] = json::array();
    for (const MeasuredCandidate& c : candidates) {
      e["candidates"].push_back({{"mode", to_string(c.choice.mode)},
                                 {"algorithm", to_string(c.choice.algorithm)},
                                 {"ms", c.seconds * 1e3}});
    }
    entries.push_back(std::move(e));
  }
  for (const auto& [keys, runs] : buckets_) {
    json e = context_json(context_);
    e["bucket"] = keys;
    e["owner"] = json::array();
    for (const MeasuredOwner& o : runs) {
      json algorithms = json::array();
      for (NsAlgorithm a : o.algorithms)
        algorithms.push_back(to_string(a));
      e["owner"].push_back({{"algorithms", algorithms}, {"ms", o.seconds * 1e3}});
    }
    entries.push_back(std::move(e));
  }
  const std::string text =
      json{{"format", kFormat}, {"version", kVersion}, {"entries", entries}}.dump(1) + "\n";
  write_file_atomic(path, text.data(), text.size());
}

const std::vector<MeasuredCandidate>* Wisdom::find(const AutoKey& key) const {
  const auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : &it->second;
}

const std::vector<MeasuredOwner>* Wisdom::find_owner(std::span<const AutoKey> bucket) const {
  const auto it = buckets_.find(std::vector<AutoKey>(bucket.begin(), bucket.end()));
  return it == buckets_.end() ? nullptr : &it->second;
}

void Wisdom::record(const AutoKey& key, std::vector<MeasuredCandidate> candidates) {
  keys_.insert_or_assign(key, std::move(candidates));
}

void Wisdom::record_owner(std::span<const AutoKey> bucket, std::vector<MeasuredOwner> runs) {
  buckets_.insert_or_assign(std::vector<AutoKey>(bucket.begin(), bucket.end()), std::move(runs));
}

}  // namespace distmuon
