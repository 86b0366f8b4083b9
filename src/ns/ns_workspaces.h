#pragma once
// Newton-Schulz scratch kept across calls: one NsWorkspace per distinct (rows, cols, Gram side)
// of the matrices orthogonalised, so that repeated optimizer steps on the same weights do not
// allocate. References stay valid as long as the NsWorkspaces lives (std::map nodes).

#include <map>
#include <tuple>

#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"

namespace distmuon::detail {

class NsWorkspaces {
 public:
  // The workspace for an x of rows x cols orthogonalised with the Gram side `side` (both
  // algorithms size their buffers from these alone).
  NsWorkspace& get(Index rows, Index cols, GramSide side) { return cache_[{rows, cols, side}]; }
  std::size_t size() const { return cache_.size(); }

 private:
  std::map<std::tuple<Index, Index, GramSide>, NsWorkspace> cache_;
};

}  // namespace distmuon::detail
