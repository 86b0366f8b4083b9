// The timeline of a bucket's NS and exchanges (exchange_schedule.h).
#include "plan/exchange_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"

namespace distmuon::detail {
namespace {

// Every rank's clock, and the one link the transfers of the bucket share.
class Timeline {
 public:
  explicit Timeline(std::size_t ranks) : now_(ranks, 0.0) {}

  // The ranks stage their data and start the exchange; returns its handle (the index).
  std::size_t start(const ExchangeTimes& x) {
    check(x);
    Started s{&x, std::vector<double>(now_.size()), 0};
    double last = 0;
    for (std::size_t r = 0; r < now_.size(); ++r) {
      now_[r] += x.pack_s[r];
      s.at[r] = now_[r];
      last = std::max(last, now_[r]);
    }
    s.transfer_end = std::max(last, link_free_) + x.transfer_s;
    link_free_ = s.transfer_end;
    started_.push_back(std::move(s));
    return started_.size() - 1;
  }

  void wait(std::size_t handle) {
    const Started& s = started_[handle];
    for (std::size_t r = 0; r < now_.size(); ++r) {
      now_[r] = std::max({now_[r], s.transfer_end, s.at[r] + s.x->link_s[r]}) + s.x->unpack_s[r];
    }
  }

  void compute(const std::vector<double>& seconds) {
    DISTMUON_ASSERT(seconds.size() == now_.size(), "one NS time per rank");
    for (std::size_t r = 0; r < now_.size(); ++r)
      now_[r] += seconds[r];
  }

  double end() const { return *std::max_element(now_.begin(), now_.end()); }

 private:
  struct Started {
    const ExchangeTimes* x;
    std::vector<double> at;  // per rank: when it started
    double transfer_end;
  };
  void check(const ExchangeTimes& x) const {
    DISTMUON_ASSERT(x.pack_s.size() == now_.size() && x.link_s.size() == now_.size() &&
                        x.unpack_s.size() == now_.size(),
                    "one time per rank");
  }
  std::vector<double> now_;
  std::vector<Started> started_;
  double link_free_ = 0;
};

}  // namespace

double schedule_seconds(std::span<const ChunkTimes> chunks, bool gathers) {
  if (chunks.empty()) return 0;
  Timeline t(chunks.front().ns_s.size());
  std::vector<std::size_t> sends;
  if (gathers) {
    std::size_t next = t.start(chunks[0].gather);
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      t.wait(next);
      if (c + 1 < chunks.size()) next = t.start(chunks[c + 1].gather);
      t.compute(chunks[c].ns_s);
      sends.push_back(t.start(chunks[c].send));
    }
  } else {
    for (const ChunkTimes& c : chunks) {
      t.compute(c.ns_s);
      sends.push_back(t.start(c.send));
    }
  }
  for (const std::size_t s : sends)
    t.wait(s);
  return t.end();
}

ChunkChoice cheapest_chunks(std::size_t matrices, const std::function<double(int)>& price) {
  std::optional<ChunkChoice> best;
  for (const int candidate : kChunkCandidates) {
    const int c = unpriced_chunks(candidate, matrices);  // capped: as the executor cuts them
    if (best && c <= best->chunks) continue;             // priced already
    const double s = price(c);
    if (!best || s < best->seconds) best = ChunkChoice{c, s};
  }
  return *best;
}

int unpriced_chunks(int requested, std::size_t matrices) {
  if (requested < 0) {
    throw Error(
        fmt::format("exchange schedule: {} chunks (valid: 0 for the cost model's choice, "
                    "or at least 1)",
                    requested));
  }
  const int chunks = requested == kChosenChunks ? kUnpricedChunks : requested;
  return static_cast<int>(std::clamp<std::size_t>(static_cast<std::size_t>(chunks), 1,
                                                  std::max<std::size_t>(matrices, 1)));
}

}  // namespace distmuon::detail
