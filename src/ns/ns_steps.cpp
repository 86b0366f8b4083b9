#include "ns/ns_steps.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "distmuon/error.h"

namespace distmuon::detail {

GramSide resolve_side(GramSide side, Index rows, Index cols) {
  if (side != GramSide::kAuto) return side;
  return rows <= cols ? GramSide::kRows : GramSide::kCols;
}

std::optional<NsStart> start_newton_schulz(MatrixView x, const NsOptions& opts, Compute& compute,
                                           const Communicator* group, std::string_view name,
                                           NormCheck check) {
  opts.validate();
  const bool distributed = group != nullptr && group->size() > 1;
  if (distributed && opts.side == GramSide::kAuto) {
    throw Error(
        fmt::format("{} over a group needs an explicit Gram side (the local shard's shape does "
                    "not tell the global orientation)",
                    name));
  }
  if (x.size() == 0) {
    // Only a local NS may stop here: over a group, every rank must reach the all-reduce below.
    // ShardLayout::validate gives every rank of a group at least one row and one column (a shape
    // of at least 1 x 1 that splits into equal TP shards, padded to equal GTP shards), so an empty
    // shard in a group is a bug in the caller, not an input.
    DISTMUON_ASSERT(!distributed, "Newton-Schulz over a group with an empty shard on this rank");
    return std::nullopt;
  }
  NsStart start;
  start.side = resolve_side(opts.side, x.rows, x.cols);
  start.s = start.side == GramSide::kRows ? x.rows : x.cols;
  start.reduce_over = distributed ? group : nullptr;

  // The norm: on the host (cpu) one sum of squares read back, all-reduced over the group on the
  // control plane and checked here; on a device backend it stays in the backend's memory (the
  // data plane all-reduces it) and a non-finite input turns x into NaN, which the caller checks.
  const std::optional<double> ss =
      check == NormCheck::kHost
          ? compute.Compute::normalize(x, opts.eps, opts.norm_in_double, start.reduce_over)
          : compute.normalize(x, opts.eps, opts.norm_in_double, start.reduce_over);
  if (ss && !std::isfinite(*ss) && check == NormCheck::kBackend) {
    // The host read the norm (cpu), but the caller checks the result: poisoned as a device
    // backend does, so that no rank of the group throws where the others go on.
    compute.fill(x, std::numeric_limits<float>::quiet_NaN());
  } else if (ss && !std::isfinite(*ss)) {
    throw Error(fmt::format("{}: input {}{} contains non-finite values (or its norm overflows)",
                            name, shape_str(x),
                            distributed ? fmt::format(" (rank {})", group->rank()) : ""));
  }
  return start;
}

void apply_input_scaling(MatrixView x, const NsOptions& opts, Compute& compute,
                         const NsStart& start, MatrixView gram) {
  if (opts.coefficients.input_scaling != CoefficientSet::InputScaling::kAol) return;
  const bool rows = start.side == GramSide::kRows;
  form_gram(compute, start.side, opts.use_syrk, Precision::kFp32, NsViews(&x, 1), NsViews(&gram, 1),
            start.reduce_over);
  Matrix a = to_host(compute, gram);
  for (Index i = 0; i < start.s; ++i) {
    double sum = 0;
    for (Index j = 0; j < start.s; ++j)
      sum += std::abs(static_cast<double>(a(i, j)));
    if (sum == 0.0) continue;  // a zero row or column stays zero
    const float d = std::isfinite(sum) ? static_cast<float>(1.0 / std::sqrt(sum))
                                       : std::numeric_limits<float>::quiet_NaN();
    compute.scale(rows ? x.block(i, 0, 1, x.cols) : x.block(0, i, x.rows, 1), d);
  }
}

std::vector<MatrixView> stacked_blocks(DeviceMatrix& m, std::size_t count, Index rows) {
  std::vector<MatrixView> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i)
    out.push_back(m.view().row_block(static_cast<Index>(i) * rows, rows));
  return out;
}

namespace {

std::vector<ConstMatrixView> consts(NsViews v) {
  return {v.begin(), v.end()};
}

}  // namespace

void form_gram(Compute& compute, GramSide side, bool use_syrk, Precision precision, NsViews x,
               NsViews a, const Communicator* group) {
  const bool rows = side == GramSide::kRows;
  const Trans t = rows ? Trans::kNo : Trans::kYes;
  if (x.size() > 1) {
    DISTMUON_ASSERT(group == nullptr, "a batch of Newton-Schulz iterations is local");
    const auto xc = consts(x);
    if (use_syrk) {
      compute.syrk_batched(t, 1.0f, xc, 0.0f, a, precision);
    } else {
      compute.gemm_batched(t, rows ? Trans::kYes : Trans::kNo, 1.0f, xc, xc, 0.0f, a, precision);
    }
    return;
  }
  if (use_syrk) {
    compute.syrk(t, 1.0f, x[0], 0.0f, a[0], precision);
  } else {
    compute.gemm(t, rows ? Trans::kYes : Trans::kNo, 1.0f, x[0], x[0], 0.0f, a[0], precision);
  }
  if (group != nullptr) {
    DISTMUON_ASSERT(a[0].contiguous(), "a Gram matrix is a contiguous workspace");
    group->data().all_reduce(std::span<float>(a[0].data, static_cast<std::size_t>(a[0].size())));
  }
}

void symmetric_square(Compute& compute, bool use_syrk, Precision precision, float alpha, NsViews a,
                      NsViews out) {
  // a symmetric: a a^T = a a.
  if (a.size() > 1) {
    const auto ac = consts(a);
    if (use_syrk) {
      compute.syrk_batched(Trans::kNo, alpha, ac, 0.0f, out, precision);
    } else {
      compute.gemm_batched(Trans::kNo, Trans::kNo, alpha, ac, ac, 0.0f, out, precision);
    }
  } else if (use_syrk) {
    compute.syrk(Trans::kNo, alpha, a[0], 0.0f, out[0], precision);
  } else {
    compute.gemm(Trans::kNo, Trans::kNo, alpha, a[0], a[0], 0.0f, out[0], precision);
  }
}

void multiply(Compute& compute, Trans ta, Trans tb, Precision precision, NsViews a, NsViews b,
              NsViews out) {
  if (a.size() > 1) {
    compute.gemm_batched(ta, tb, 1.0f, consts(a), consts(b), 0.0f, out, precision);
  } else {
    compute.gemm(ta, tb, 1.0f, a[0], b[0], 0.0f, out[0], precision);
  }
}

}  // namespace distmuon::detail
