// The check of a coefficient schedule at the step count it runs (newton_schulz.h): the composed
// per-step polynomials applied to singular values across (0, 1].
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"

namespace distmuon {
namespace {

// Singular values of the normalised input: 200 log-spaced from 1e-6 up to the floor, then every
// 1/4096 from the floor to 1. The band is checked at these points (the composed polynomials of
// the built-in sets vary on a scale of about 0.01); a reversed or diverging direction is checked
// over the whole of every cell between two points (apply_range), so none is missed.
const std::vector<double>& sigma_grid() {
  static const std::vector<double> grid = [] {
    std::vector<double> g;
    const double lo = std::log10(1e-6), hi = std::log10(kScheduleSigmaFloor);
    for (int i = 0; i < 200; ++i)
      g.push_back(std::pow(10.0, lo + (hi - lo) * i / 200.0));
    for (int i = 0;; ++i) {
      const double x = kScheduleSigmaFloor + i / 4096.0;
      if (x >= 1.0) break;
      g.push_back(x);
    }
    g.push_back(1.0);
    return g;
  }();
  return grid;
}

double apply(const NsCoefficients& k, double x) {
  const double x2 = x * x;
  return x * (k.a + x2 * (k.b + x2 * k.c));
}

// The exact range of p(x) = a x + b x^3 + c x^5 over [lo, hi]: its values at the ends and where
// its derivative a + 3b x^2 + 5c x^4 vanishes inside (a quadratic in y = x^2). The image of an
// interval under a continuous function is the interval between its extremes, so propagating a
// cell's interval step by step gives the exact range of the composed schedule over the cell:
// no dip between grid points, however narrow, is missed.
struct Range {
  double lo, hi;
};
Range apply_range(const NsCoefficients& k, Range r) {
  Range out{std::min(apply(k, r.lo), apply(k, r.hi)), std::max(apply(k, r.lo), apply(k, r.hi))};
  const auto consider = [&](double y) {  // a critical point at x^2 = y
    if (!(y > 0) || !std::isfinite(y)) return;
    for (const double x : {std::sqrt(y), -std::sqrt(y)}) {
      if (x > r.lo && x < r.hi) {
        out.lo = std::min(out.lo, apply(k, x));
        out.hi = std::max(out.hi, apply(k, x));
      }
    }
  };
  const double qa = 5.0 * k.c, qb = 3.0 * k.b, qc = k.a;  // qa y^2 + qb y + qc = 0
  if (qa == 0.0) {
    if (qb != 0.0) consider(-qc / qb);
  } else {
    const double disc = qb * qb - 4.0 * qa * qc;
    if (disc >= 0.0) {
      // The two roots without cancellation (Numerical Recipes 5.6).
      const double q = -0.5 * (qb + std::copysign(std::sqrt(disc), qb));
      consider(q / qa);
      if (q != 0.0) consider(qc / q);
    }
  }
  return out;
}

// The upper end of p's range over r raised by the rounding of its terms (schedule_rounding).
Range apply_rounded(const NsCoefficients& k, Range r, double u) {
  Range out = apply_range(k, r);
  const double h = std::max(std::abs(r.lo), std::abs(r.hi)), h2 = h * h;
  out.hi += u * h * (std::abs(k.a) + h2 * (std::abs(k.b) + h2 * std::abs(k.c)));
  return out;
}

// Runs the schedule for up_to steps over the grid; result[k - 1] is the check at k steps (with
// every_step; otherwise the one check at up_to steps).
std::vector<ScheduleCheck> run_checks(const CoefficientSet& set, int up_to, bool every_step,
                                      Precision precision) {
  const std::vector<double>& grid = sigma_grid();
  std::vector<double> x = grid;
  // The exact range of every cell [grid[i], grid[i + 1]] under the steps so far.
  std::vector<Range> cells(grid.size() - 1);
  for (std::size_t i = 0; i + 1 < grid.size(); ++i)
    cells[i] = {grid[i], grid[i + 1]};
  // At a reduced precision: every cell's range with each step's rounding (schedule_rounding),
  // cell by cell, since the rounding grows with the magnitude of the terms at that sigma.
  const double u = schedule_rounding(precision);
  std::vector<Range> rounded = u > 0 ? cells : std::vector<Range>{};
  std::string rounding_broken;  // where the rounded run diverged
  std::vector<ScheduleCheck> out;
  std::string broken;  // an intermediate that failed: every longer run fails the same way
  for (int step = 0; step < up_to; ++step) {
    const NsCoefficients& k = set.at(step);
    ScheduleCheck c;
    c.precision = precision;
    double worst_below = 0, worst_below_sigma = 0;  // the largest final value below the floor
    c.final_lo = std::numeric_limits<double>::infinity();
    c.final_hi = -std::numeric_limits<double>::infinity();
    double rounded_hi = 0;  // the largest value with rounding after this step
    for (std::size_t i = 0; i < rounded.size(); ++i) {
      rounded[i] = apply_rounded(k, rounded[i], u);
      rounded_hi = std::max(rounded_hi, rounded[i].hi);
      if (rounding_broken.empty() && !(std::isfinite(rounded[i].hi) && rounded[i].hi < 1e6)) {
        rounding_broken = fmt::format(
            "at {} its rounding (unit roundoff {:.3g} on the terms of each step's polynomial) "
            "takes a singular value in [{:.6g}, {:.6g}] to {:.4g} at step {} (it diverges)",
            to_string(precision), u, grid[i], grid[i + 1], rounded[i].hi, step + 1);
      }
    }
    for (std::size_t i = 0; i < cells.size(); ++i) {
      cells[i] = apply_range(k, cells[i]);
      if (broken.empty() &&
          !(std::isfinite(cells[i].lo) && std::isfinite(cells[i].hi) && cells[i].lo > 0)) {
        broken = fmt::format("it takes a singular value in [{:.6g}, {:.6g}] to {:.4g} at step {}{}",
                             grid[i], grid[i + 1],
                             std::isfinite(cells[i].hi) ? cells[i].lo : cells[i].hi, step + 1,
                             std::isfinite(cells[i].lo) && std::isfinite(cells[i].hi)
                                 ? " (a reversed or cancelled direction of the update)"
                                 : " (it diverges)");
      }
    }
    for (std::size_t i = 0; i < grid.size(); ++i) {
      x[i] = apply(k, x[i]);
      if (broken.empty() && !(std::isfinite(x[i]) && x[i] > 0)) {
        broken = fmt::format(
            "it takes singular value {:.4g} to {:.4g} at step {}{}", grid[i], x[i], step + 1,
            std::isfinite(x[i]) ? " (a reversed or cancelled direction of the update)"
                                : " (it diverges)");
      }
      if (grid[i] >= kScheduleSigmaFloor) {
        c.final_lo = std::min(c.final_lo, x[i]);
        c.final_hi = std::max(c.final_hi, x[i]);
      } else if (!(x[i] <= worst_below)) {
        worst_below = x[i];
        worst_below_sigma = grid[i];
      }
    }
    c.rounded_hi = u > 0 ? rounded_hi : std::max(c.final_hi, worst_below);
    const bool rounding_blows_up = u > 0 && rounding_broken.empty() && rounded_hi > kScheduleBlowUp;
    c.refused = !broken.empty() || c.final_hi > kScheduleBlowUp || worst_below > kScheduleBlowUp ||
                !rounding_broken.empty() || rounding_blows_up;
    if (!broken.empty()) {
      c.problem = broken;
    } else if (!rounding_broken.empty()) {
      c.problem = rounding_broken;
    } else if (rounding_blows_up) {
      c.problem = fmt::format(
          "at {} its rounding (unit roundoff {:.3g} on the terms of each step's polynomial) can "
          "take a singular value to {:.4g} (a blown-up direction of the update)",
          to_string(precision), u, rounded_hi);
    } else if (!(c.final_lo >= set.band_lo && c.final_hi <= set.band_hi)) {
      c.problem = fmt::format(
          "it maps singular values in [{}, 1] to [{:.4g}, {:.4g}], outside its band [{}, {}]{}",
          kScheduleSigmaFloor, c.final_lo, c.final_hi, set.band_lo, set.band_hi,
          c.final_hi > kScheduleBlowUp ? " (a blown-up direction of the update)" : "");
    } else if (!(worst_below <= set.band_hi)) {
      c.problem =
          fmt::format("it maps singular value {:.4g} to {:.4g}, above its band [{}, {}]{}",
                      worst_below_sigma, worst_below, set.band_lo, set.band_hi,
                      worst_below > kScheduleBlowUp ? " (a blown-up direction of the update)" : "");
    }
    c.ok = c.problem.empty();
    if (every_step || step + 1 == up_to) out.push_back(std::move(c));
  }
  return out;
}

std::string format_steps(const std::vector<int>& steps) {
  if (steps.empty()) return "no step count";
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < steps.size();) {
    std::size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1)
      ++j;
    parts.push_back(j == i ? fmt::format("{}", steps[i])
                           : fmt::format("{}-{}", steps[i], steps[j]));
    i = j + 1;
  }
  return fmt::format("{} steps", fmt::join(parts, ", "));
}

// The schedules accepted last on this thread: NsOptions::validate runs on every NS call, the
// grid check once per schedule and step count.
struct Accepted {
  std::vector<NsCoefficients> table;
  CoefficientSet::Tail tail;
  double band_lo, band_hi;
  bool warn_outside_band;
  int steps;
  Precision precision;

  bool same(const CoefficientSet& s, int k, Precision p) const {
    return steps == k && precision == p && tail == s.tail && band_lo == s.band_lo &&
           band_hi == s.band_hi && warn_outside_band == s.warn_outside_band && table == s.table;
  }
};

bool remembered(const CoefficientSet& s, int steps, Precision precision, bool remember) {
  thread_local std::vector<Accepted> accepted;
  for (const Accepted& a : accepted) {
    if (a.same(s, steps, precision)) return true;
  }
  if (remember) {
    if (accepted.size() >= 8) accepted.erase(accepted.begin());
    accepted.push_back(
        {s.table, s.tail, s.band_lo, s.band_hi, s.warn_outside_band, steps, precision});
  }
  return false;
}

// Whether a schedule accepted outside its band is warned about for the first time in this
// process (once per schedule and step count, whichever thread).
bool first_warning(const CoefficientSet& s, int steps, Precision precision) {
  static std::mutex mutex;
  static std::vector<Accepted> warned;
  std::lock_guard<std::mutex> lock(mutex);
  for (const Accepted& a : warned) {
    if (a.same(s, steps, precision)) return false;
  }
  warned.push_back({s.table, s.tail, s.band_lo, s.band_hi, s.warn_outside_band, steps, precision});
  return true;
}

}  // namespace

double schedule_rounding(Precision precision) {
  switch (precision) {
    case Precision::kTf32:
      return std::ldexp(1.0, -11);  // 10 stored significand bits
    case Precision::kBf16:
      return std::ldexp(1.0, -9);  // 7 stored significand bits
    default:
      return 0.0;
  }
}

ScheduleCheck check_schedule(const CoefficientSet& set, int steps, Precision precision) {
  DISTMUON_ASSERT(steps >= 1 && !set.table.empty(), "check_schedule: steps >= 1, a schedule");
  return run_checks(set, steps, false, precision).back();
}

std::vector<int> supported_steps(const CoefficientSet& set, int up_to, Precision precision) {
  std::vector<int> out;
  if (up_to < 1 || set.table.empty()) return out;
  const std::vector<ScheduleCheck> checks = run_checks(set, up_to, true, precision);
  for (int k = 1; k <= up_to; ++k) {
    const bool allowed = !set.required_steps || *set.required_steps == k;
    if (allowed && checks[static_cast<std::size_t>(k - 1)].ok) out.push_back(k);
  }
  return out;
}

void CoefficientSet::validate_schedule(int steps, Precision precision) const {
  if (remembered(*this, steps, precision, false)) return;
  const ScheduleCheck c = check_schedule(*this, steps, precision);
  // "at bf16" where the precision changes the verdict's list of supported step counts.
  const std::string at =
      precision == Precision::kFp32 ? "" : fmt::format(" at {}", to_string(precision));
  if (!c.ok && warn_outside_band && !c.refused) {
    if (first_warning(*this, steps, precision)) {
      spdlog::warn(
          "Newton-Schulz coefficient set '{}' at {} steps does not fully orthogonalise: {}; "
          "it runs as asked ('{}' lands in its band at {}{})",
          name, steps, c.problem, name,
          format_steps(supported_steps(*this, kScheduleCheckedSteps, precision)), at);
    }
  } else if (!c.ok) {
    throw Error(fmt::format(
        "Newton-Schulz coefficient set '{}' at {} steps does not orthogonalise: {}; '{}' "
        "supports {}{} (of 1-{} checked; docs/optimizer.md lists each set's band)",
        name, steps, c.problem, name,
        format_steps(supported_steps(*this, kScheduleCheckedSteps, precision)), at,
        kScheduleCheckedSteps));
  }
  remembered(*this, steps, precision, true);
}

}  // namespace distmuon
