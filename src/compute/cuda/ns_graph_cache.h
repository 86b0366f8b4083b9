#pragma once
// The key of a captured bf16-storage Newton-Schulz (Compute::newton_schulz_bf16 on the CUDA
// backend, DISTMUON_CUDA_GRAPHS=1: cuda_graphs.h) and the bounded cache of the graphs, least
// recently used evicted first. Plain C++ (no CUDA header), so that the tests check it without a
// GPU: the cache is generic in what it holds and takes the function that destroys it.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <utility>
#include <vector>

#include "distmuon/compute.h"

namespace distmuon::cuda {

// Everything a captured newton_schulz_bf16 depends on: a graph holds every pointer, shape,
// leading dimension and coefficient of the calls it recorded, so two calls may share a graph only
// when all of these are equal. The coefficients compare bit for bit (-0 and 0 are different
// keys: the graph replays the captured bits).
struct NsGraphKey {
  struct Matrix {
    const float* data = nullptr;
    Index ld = 0;
    bool operator==(const Matrix&) const = default;
  };
  std::vector<Matrix> xs;  // every matrix of the batch, in order
  Index rows = 0, cols = 0;
  bool gram_rows = true;                    // the rows/cols flag
  std::vector<std::uint32_t> coefficients;  // a, b, c of every step, as float bits
  bool use_syrk = false;
  Precision precision = Precision::kBf16;
  const float* scratch = nullptr;  // the scratch view: pointer, shape, leading dimension
  Index scratch_rows = 0, scratch_cols = 0, scratch_ld = 0;
  const void* pointers = nullptr;  // the backend's device array of block pointers
  bool operator==(const NsGraphKey&) const = default;
};

// A backend's graphs: the keys run uncaptured at their first call (warm-ups), the captures, the
// replays, the entries evicted and held.
struct GraphStats {
  std::size_t warmups = 0, captures = 0, replays = 0, evictions = 0, cached = 0;
};

inline NsGraphKey ns_graph_key(std::span<const MatrixView> xs, bool rows,
                               std::span<const NsStep> steps, bool use_syrk, Precision precision,
                               MatrixView scratch, const void* pointers) {
  NsGraphKey k;
  k.xs.reserve(xs.size());
  for (const MatrixView& x : xs)
    k.xs.push_back({x.data, x.ld});
  if (!xs.empty()) {
    k.rows = xs[0].rows;
    k.cols = xs[0].cols;
  }
  k.gram_rows = rows;
  k.coefficients.reserve(3 * steps.size());
  for (const NsStep& s : steps) {
    for (const float v : {s.a, s.b, s.c})
      k.coefficients.push_back(std::bit_cast<std::uint32_t>(v));
  }
  k.use_syrk = use_syrk;
  k.precision = precision;
  k.scratch = scratch.data;
  k.scratch_rows = scratch.rows;
  k.scratch_cols = scratch.cols;
  k.scratch_ld = scratch.ld;
  k.pointers = pointers;
  return k;
}

// At most `capacity` values by key; a lookup makes its entry the most recently used, an insert
// into a full cache destroys the least recently used value first. Every value left is destroyed
// with the cache. Linear lookup: a few dozen keys, each found once per Newton-Schulz call.
template <class Key, class Value>
class LruCache {
 public:
  LruCache(std::size_t capacity, std::function<void(Value&)> destroy)
      : capacity_(capacity < 1 ? 1 : capacity), destroy_(std::move(destroy)) {}
  ~LruCache() { clear(); }
  LruCache(const LruCache&) = delete;
  LruCache& operator=(const LruCache&) = delete;

  // The value of key (now the most recently used), or nullptr.
  Value* find(const Key& key) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == key) {
        entries_.splice(entries_.begin(), entries_, it);
        return &entries_.front().second;
      }
    }
    return nullptr;
  }
  // Adds key (not in the cache) as the most recently used, evicting the least recently used
  // entry when full. Returns the stored value.
  Value& insert(Key key, Value value) {
    if (entries_.size() >= capacity_) evict_oldest();
    entries_.emplace_front(std::move(key), std::move(value));
    return entries_.front().second;
  }
  std::size_t size() const { return entries_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::size_t evictions() const { return evictions_; }
  // The keys, most recently used first.
  std::vector<Key> keys() const {
    std::vector<Key> out;
    for (const auto& e : entries_)
      out.push_back(e.first);
    return out;
  }
  // Destroys every value (a failing destroy is ignored: this runs when the backend goes).
  void clear() noexcept {
    while (!entries_.empty()) {
      Value v = std::move(entries_.back().second);
      entries_.pop_back();
      try {
        destroy_(v);
      } catch (...) {  // NOLINT(bugprone-empty-catch): teardown
      }
    }
  }

 private:
  // Out of the cache before it is destroyed: a destroy that throws leaves no dangling entry.
  void evict_oldest() {
    Value v = std::move(entries_.back().second);
    entries_.pop_back();
    ++evictions_;
    destroy_(v);
  }

  std::size_t capacity_;
  std::function<void(Value&)> destroy_;
  std::list<std::pair<Key, Value>> entries_;  // most recently used first
  std::size_t evictions_ = 0;
};

}  // namespace distmuon::cuda
