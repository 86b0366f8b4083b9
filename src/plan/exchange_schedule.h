#pragma once
// The timeline of a bucket's Newton-Schulz and exchanges on every rank, as owner mode's executor
// schedules them (tp/owner_ns.h, orthogonalize_owned): the cost model's owner and replica bucket
// estimates (owner_cost.cpp) price their serial and pipelined schedules with it. Internal to
// src/plan.

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

namespace distmuon::detail {

// One all-to-all, per rank (vectors of the bucket's rank count).
struct ExchangeTimes {
  std::vector<double> pack_s;    // staging what the rank sends, before the exchange starts
  std::vector<double> link_s;    // an emulated link's minimum from the rank's start (0: none)
  std::vector<double> unpack_s;  // copying what arrived into place, after the exchange ends
  // The transfer itself: it starts once every rank has started the exchange and the previous
  // transfer of the bucket is done (one link), and lasts this long.
  double transfer_s = 0;
};

// One chunk of the bucket.
struct ChunkTimes {
  ExchangeTimes gather;      // owner mode: the chunk's gather, before its NS (replicas: unused)
  std::vector<double> ns_s;  // per rank: the NS of the chunk's weights it orthogonalises
  ExchangeTimes send;        // after the NS: owner mode's scatter, or the replicas' exchange
};

// The time from the bucket's start to the end of its slowest rank. gathers: owner mode's
// schedule (start chunk 0's gather; per chunk, wait for its gather, start the next chunk's, run
// its NS, start its scatter; then wait for the scatters in order); else the replicas' (per chunk,
// its NS, then start its exchange; then wait for the exchanges in order). One chunk is the serial
// schedule. A wait ends when the rank's own link minimum and the transfer are both over.
double schedule_seconds(std::span<const ChunkTimes> chunks, bool gathers);

// A bucket's chunk count and its seconds on that many chunks.
struct ChunkChoice {
  int chunks = 1;
  double seconds = 0;
};
// The cheapest count of kChunkCandidates (cost_model.h), each capped at `matrices` (1 at least:
// a bucket of 3 prices 1, 2 and 3 chunks, so the choice is never dearer than any candidate's
// count as the executor runs it), price(c) being the bucket's seconds on c chunks; ties (anything
// not cheaper) go to the fewer chunks. A pure function of price: ranks that price the same
// inputs choose the same count.
ChunkChoice cheapest_chunks(std::size_t matrices, const std::function<double(int)>& price);

// The chunks a bucket of `matrices` runs in when asked for `requested` (ExchangeSchedule::chunks)
// and nothing is priced: requested, or kUnpricedChunks for kChosenChunks, capped at matrices (the
// executor's chunk_starts makes no empty chunk) and 1 at least. Throws for requested < 0.
int unpriced_chunks(int requested, std::size_t matrices);

}  // namespace distmuon::detail
