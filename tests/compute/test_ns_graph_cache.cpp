// The key and cache of the CUDA backend's captured Newton-Schulz
// (src/compute/cuda/ns_graph_cache.h, DISTMUON_CUDA_GRAPHS=1): plain C++, so it runs on every
// machine. A graph replays every pointer, shape, leading dimension and coefficient it captured, so
// the key must differ whenever any of them does; the cache keeps at most its capacity, the least
// recently used evicted (destroyed) first, and destroys what it holds when it goes.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "compute/cuda/ns_graph_cache.h"

namespace distmuon::cuda {
namespace {

struct Call {
  std::vector<float> a = std::vector<float>(64), b = std::vector<float>(64),
                     scratch = std::vector<float>(256);
  std::vector<MatrixView> xs{{a.data(), 4, 8, 8}, {b.data(), 4, 8, 8}};
  bool rows = true;
  std::vector<NsStep> steps{{3.4445f, -4.7750f, 2.0315f}, {1.5f, -0.5f, 0.0f}};
  bool syrk = true;
  Precision precision = Precision::kBf16;
  MatrixView work{scratch.data(), 1, 256, 256};
  int pointers_storage[2] = {};
  const void* pointers = &pointers_storage[0];

  NsGraphKey key() const { return ns_graph_key(xs, rows, steps, syrk, precision, work, pointers); }
};

TEST(NsGraphKey, EqualCallsHaveEqualKeys) {
  Call c;
  const NsGraphKey before = c.key();
  // New values in the same buffers: the same key (the graph reads the buffers when replayed).
  c.a[0] = 7.0f;
  c.scratch[3] = -1.0f;
  EXPECT_EQ(c.key(), before);
  // The same call on other buffers: another key.
  const Call other;
  EXPECT_NE(other.key(), before);
}

TEST(NsGraphKey, EveryFieldChangesTheKey) {
  const Call base;
  const NsGraphKey k = base.key();
  std::vector<std::pair<std::string, std::function<void(Call&)>>> changes = {
      {"a matrix pointer", [](Call& c) { c.xs[1].data += 32; }},
      {"a leading dimension", [](Call& c) { c.xs[0].ld = 16; }},
      {"the rows", [](Call& c) { c.xs[0].rows = c.xs[1].rows = 2; }},
      {"the columns", [](Call& c) { c.xs[0].cols = c.xs[1].cols = 4; }},
      {"the batch size", [](Call& c) { c.xs.pop_back(); }},
      {"the Gram side", [](Call& c) { c.rows = false; }},
      {"coefficient a", [](Call& c) { c.steps[0].a += 1e-6f; }},
      {"coefficient b", [](Call& c) { c.steps[1].b = -0.25f; }},
      {"coefficient c", [](Call& c) { c.steps[1].c = -0.0f; }},  // -0 is not 0
      {"the step count", [](Call& c) { c.steps.pop_back(); }},
      {"use_syrk", [](Call& c) { c.syrk = false; }},
      {"the precision", [](Call& c) { c.precision = Precision::kTf32; }},
      {"the scratch pointer", [](Call& c) { c.work.data += 8; }},
      {"the scratch size", [](Call& c) { c.work.cols = 128; }},
      {"the scratch leading dimension", [](Call& c) { c.work.ld = 300; }},
      {"the block pointers", [](Call& c) { c.pointers = static_cast<const int*>(c.pointers) + 1; }},
  };
  for (auto& [what, change] : changes) {
    Call c;
    c.xs = base.xs;  // the same buffers as base: only `change` differs
    c.work = base.work;
    c.pointers = base.pointers;
    ASSERT_EQ(c.key(), k) << what;
    change(c);
    EXPECT_NE(c.key(), k) << what;
  }
}

TEST(LruCache, EvictsTheLeastRecentlyUsedAndDestroysEverything) {
  std::vector<int> destroyed;
  {
    LruCache<int, int> cache(3, [&](int& v) { destroyed.push_back(v); });
    cache.insert(1, 10);
    cache.insert(2, 20);
    cache.insert(3, 30);
    ASSERT_NE(cache.find(1), nullptr);  // 1 is now the most recently used: 2 is the oldest
    EXPECT_EQ(*cache.find(1), 10);
    EXPECT_EQ(cache.find(4), nullptr);
    cache.insert(4, 40);
    EXPECT_EQ(destroyed, std::vector<int>{20});
    EXPECT_EQ(cache.find(2), nullptr);
    EXPECT_EQ(cache.keys(), (std::vector<int>{4, 1, 3}));
    cache.insert(5, 50);  // 3 is the oldest now
    EXPECT_EQ(destroyed, (std::vector<int>{20, 30}));
    EXPECT_EQ(cache.size(), 3u);
    EXPECT_EQ(cache.evictions(), 2u);
  }
  // The rest, destroyed with the cache (oldest first).
  EXPECT_EQ(destroyed, (std::vector<int>{20, 30, 10, 40, 50}));
}

TEST(LruCache, AFailingDestroyLeavesNoEntryBehind) {
  LruCache<int, int> cache(1, [](int& v) {
    if (v == 10) throw std::runtime_error("destroy failed");
  });
  cache.insert(1, 10);
  EXPECT_THROW(cache.insert(2, 20), std::runtime_error);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.find(1), nullptr);
  cache.insert(2, 20);
  EXPECT_EQ(cache.size(), 1u);
}

}  // namespace
}  // namespace distmuon::cuda
