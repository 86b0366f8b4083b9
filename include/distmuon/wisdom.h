#pragma once
// Wisdom: the times tp_mode=auto's measure mode (measure_plan.h) took on this machine, kept in a
// JSON file so that a later run reuses them instead of timing again (FFTW's wisdom).
//
// An entry is keyed by what its times depend on: the weight's key (shape, group sizes, partition,
// domain crossing, NS steps, syrk, precision, the algorithms allowed) or, for owner mode, the
// ordered keys of a bucket; the host (hostname, CPU model, BLAS core and threads per rank); and
// the profile and cost model that chose the candidates; and the compute backend timed. Entries of
// another host, profile, cost model or backend are kept in the file but not used.
//
// File format (version 1):
//   {"format": "distmuon wisdom", "version": 1, "entries": [
//     {"host": {"hostname": "...", "cpu": "...", "blas_core": "SkylakeX", "blas_threads": 1},
//      "profile": "none", "cost_model": "refined", "device": "cpu-openblas" (absent: cpu),
//      "key": {AutoKey as in checkpoints},
//      "candidates": [{"mode": "duplicated", "algorithm": "gram", "ms": 12.3}, ...]},
//     {"host": ..., "profile": ..., "cost_model": ...,
//      "bucket": [{AutoKey}, ...], "owner": [{"algorithms": ["gram", ...], "ms": 80.1}, ...]}]}

#include <cstddef>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "distmuon/cost_model.h"
#include "distmuon/measure_plan.h"

namespace distmuon {

struct HostIdentity {
  std::string hostname;
  std::string cpu;        // CPU model (/proc/cpuinfo)
  std::string blas_core;  // the BLAS kernel set in use (OpenBLAS core name)
  int blas_threads = 1;   // BLAS threads per rank
  bool operator==(const HostIdentity&) const = default;
};
HostIdentity this_host();
std::string describe(const HostIdentity& host);  // "node1 (Intel Xeon ..., SkylakeX, 1 thread)"

// What an entry must match to be used.
struct WisdomContext {
  HostIdentity host;
  std::string profile = "none";  // the profile's name
  std::string cost_model = "refined";
  std::string device = "cpu-openblas";  // the compute backend timed (Compute::name())
  bool operator==(const WisdomContext&) const = default;
};

class Wisdom {
 public:
  explicit Wisdom(WisdomContext context) : context_(std::move(context)) {}

  // The wisdom of path for context. A missing file gives empty wisdom; a file that is not valid
  // wisdom throws distmuon::Error naming it and the problem (it is never overwritten silently).
  static Wisdom load(const std::filesystem::path& path, WisdomContext context);
  // Writes every entry (those of other contexts unchanged) atomically (file_io.h).
  void save(const std::filesystem::path& path) const;

  // The recorded candidates of a key / owner runs of a bucket, or null.
  const std::vector<MeasuredCandidate>* find(const AutoKey& key) const;
  const std::vector<MeasuredOwner>* find_owner(std::span<const AutoKey> bucket) const;
  void record(const AutoKey& key, std::vector<MeasuredCandidate> candidates);
  void record_owner(std::span<const AutoKey> bucket, std::vector<MeasuredOwner> runs);

  const WisdomContext& context() const { return context_; }
  std::size_t size() const { return keys_.size() + buckets_.size(); }  // usable entries
  // Entries of another host, profile or cost model (kept, not used), and why, for the log.
  std::size_t foreign() const { return foreign_.size(); }
  const std::vector<std::string>& foreign_reasons() const { return foreign_reasons_; }

 private:
  WisdomContext context_;
  std::map<AutoKey, std::vector<MeasuredCandidate>> keys_;
  std::map<std::vector<AutoKey>, std::vector<MeasuredOwner>> buckets_;
  std::vector<std::string> foreign_;  // entries of other contexts, as JSON text
  std::vector<std::string> foreign_reasons_;
};

}  // namespace distmuon
