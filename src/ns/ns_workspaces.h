#pragma once
// Scratch in a backend's memory kept across calls, so that repeated optimizer steps on the same
// weights do not allocate: one NsWorkspace per distinct (rows, cols, Gram side) of the matrices
// orthogonalised, and the buffers the TP modes gather into (gathered shards, class rows, owner
// buffers, all-to-all staging), keyed by their role, a slot and their shape. References stay
// valid as long as the NsWorkspaces lives (std::map nodes).

#include <cstddef>
#include <map>
#include <tuple>

#include "distmuon/compute.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"

namespace distmuon::detail {

// What a gathered buffer is for (two buffers alive at once never share a role and slot).
enum class BufferRole {
  kTpLocal,    // duplicated / distributed: the GTP-gathered TP-local tensor
  kFull,       // duplicated: the TP-gathered full work matrix; owner: the owner's full matrix
  kHeldFull,   // duplicated: a full work matrix held until its batch of equal shapes runs
  kGathered,   // distributed: the work matrix gathered over the smaller group
  kStaging,    // all_gather_shards: the column shards before their interleave; a contiguous send
  kClassRows,  // a row class's rows collected from the work matrix
  kSend,       // owner: all-to-all send staging
  kRecv,       // owner: all-to-all receive staging
  kSendBf16,   // owner: the send staging packed for a bf16 wire (two values per float)
  kRecvBf16,   // owner: the receive staging as it arrives on a bf16 wire
};

class NsWorkspaces {
 public:
  // The workspace for an x of rows x cols orthogonalised with the Gram side `side` (both
  // algorithms size their buffers from these alone).
  NsWorkspace& get(Index rows, Index cols, GramSide side) { return cache_[{rows, cols, side}]; }
  std::size_t size() const { return cache_.size(); }
  // The workspace for a batch of count such matrices (run_newton_schulz_batch: its matrices
  // stack count blocks).
  NsWorkspace& batch(std::size_t count, Index rows, Index cols, GramSide side) {
    return batches_[{count, rows, cols, side}];
  }

  // A rows x cols buffer of compute's memory for `role` and `slot` (e.g. a weight's index in an
  // owner bucket); allocated the first time the key is seen, its contents unspecified.
  DeviceMatrix& buffer(Compute& compute, BufferRole role, std::size_t slot, Index rows,
                       Index cols) {
    DeviceMatrix& m = buffers_[{role, slot, rows, cols}];
    m.ensure(compute, rows, cols);
    return m;
  }

 private:
  std::map<std::tuple<Index, Index, GramSide>, NsWorkspace> cache_;
  std::map<std::tuple<std::size_t, Index, Index, GramSide>, NsWorkspace> batches_;
  std::map<std::tuple<BufferRole, std::size_t, Index, Index>, DeviceMatrix> buffers_;
};

}  // namespace distmuon::detail
