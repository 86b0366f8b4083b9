// Compute::muon_directions's and Compute::muon_apply's defaults (compute.h): Muon's fused
// per-element passes as the separate operations they fuse, in the order that defines their
// results. The CPU backend fuses them (src/compute/cpu); the other backends run these.
#include <fmt/format.h>

#include "compute/shape_checks.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {

void Compute::muon_directions(const MomentumStep& k, std::span<const MuonDirection> dirs,
                              std::span<const ConstMatrixView> others,
                              std::span<std::optional<MatrixIndex>> found, std::span<double> sums) {
  detail::check_muon_directions(dirs, others, found, sums);
  std::vector<ConstMatrixView> checked;
  checked.reserve(found.size());
  for (const MuonDirection& d : dirs) {
    checked.push_back(d.g.row_block(0, d.checked_rows));
    checked.push_back(d.w.row_block(0, d.checked_rows));
    checked.push_back(d.buf.row_block(0, d.checked_rows));
  }
  checked.insert(checked.end(), others.begin(), others.end());
  find_non_finite(checked, found);
  std::vector<ConstMatrixView> summed;
  for (const MuonDirection& d : dirs) {
    copy(d.buf, d.u);
    muon_momentum(k, d.g, d.w, d.u, d.u);
    if (d.sums) summed.insert(summed.end(), {d.w, d.u});
  }
  if (!summed.empty()) sum_squares(summed, true, sums);
}

void Compute::muon_apply(const MomentumStep& k, ConstMatrixView g, MatrixView w, MatrixView buf,
                         ConstMatrixView u, float decay, float lr) {
  detail::check_same("muon_apply", "update", u, g);
  MomentumStep plain = k;
  plain.nesterov = false;  // u = buf: buf advanced once
  muon_momentum(plain, g, w, buf, buf);
  if (decay != 1.0f) scale(w, decay);
  axpby(-lr, u, 1.0f, w);
}

}  // namespace distmuon
