#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <map>

#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"

namespace distmuon {
namespace {

using Tail = CoefficientSet::Tail;

std::vector<NsCoefficients> repeat(NsCoefficients c, int n) {
  return std::vector<NsCoefficients>(n, c);
}

const std::map<std::string, CoefficientSet, std::less<>>& registry() {
  static const auto sets = [] {
    std::map<std::string, CoefficientSet, std::less<>> m;
    auto add = [&](CoefficientSet s) { m.emplace(s.name, std::move(s)); };
    add({"simple", {{3.4445, -4.7750, 2.0315}}, Tail::kCycle, {}, 0.65, 1.25});
    add({"quintic",
         {{4.0848, -6.8946, 2.9270},
          {3.9505, -6.3029, 2.6377},
          {3.7418, -5.5913, 2.3037},
          {2.8769, -3.1427, 1.2046},
          {2.8366, -3.0525, 1.2012}},
         Tail::kCycle,
         {},
         0.9,
         1.15});
    add({"polar_express",
         {{8.2051, -22.9019, 16.4607},
          {4.0664, -2.8612, 0.5184},
          {3.9096, -2.8234, 0.5250},
          {3.2856, -2.4153, 0.4853},
          {2.2779, -1.6198, 0.3985},
          {1.8726, -1.2307, 0.3585},
          {1.8564, -1.2132, 0.3568},
          {1.8750, -1.2500, 0.3750}},
         Tail::kRepeatLast,
         {},
         0.86,
         1.14});
    add({"cans",
         {{8.4703, -25.1081, 18.6293},
          {4.1828, -3.1087, 0.5806},
          {3.9619, -2.9541, 0.5630},
          {3.2866, -2.4647, 0.5074},
          {2.2737, -1.6447, 0.4162}},
         Tail::kRepeatLast,
         {},
         0.86,
         1.14});
    // Turbo-Muon's table for AOL-rescaled inputs (flash-newton-schulz, newton_schulz_triton.py
    // at commit cdb03db; the table of its first commit, b73111d, was fitted with a mis-scaled
    // Gram matrix and replaced upstream: its first tuple is negative for sigma > 0.884).
    CoefficientSet aol{"aol",
                       {{4.6051, -9.6552, 5.6769},
                        {4.7505, -6.0861, 2.1790},
                        {2.7763, -2.3190, 0.5523},
                        {2.4231, -2.2861, 0.8193}},
                       Tail::kCycle,
                       {},
                       0.9,
                       1.15};
    aol.input_scaling = CoefficientSet::InputScaling::kAol;
    add(std::move(aol));
    auto ds = repeat({3.4445, -4.7750, 2.0315}, 8);
    ds.push_back({2.0, -1.5, 0.5});
    ds.push_back({2.0, -1.5, 0.5});
    add({"deepseekv4", ds, Tail::kRepeatLast, {}, 0.95, 1.05});
    add({"cubic5",
         {{3.3656576, -3.3420992, 0},
          {2.5744352, -1.4957376, 0},
          {2.5368962, -1.4312570, 0},
          {2.4418906, -1.2764040, 0},
          {2.2230472, -0.9630650, 0}},
         Tail::kCycle,
         5,
         0.75,
         1.32});
    return m;
  }();
  return sets;
}

}  // namespace

const NsCoefficients& CoefficientSet::at(int step) const {
  DISTMUON_ASSERT(!table.empty() && step >= 0, "coefficient schedule lookup");
  const auto n = static_cast<int>(table.size());
  if (step < n) return table[static_cast<std::size_t>(step)];
  return tail == Tail::kRepeatLast ? table.back() : table[static_cast<std::size_t>(step % n)];
}

void CoefficientSet::validate_steps(int steps) const {
  if (steps < 1 || steps > kMaxNsSteps) {
    throw Error(
        fmt::format("Newton-Schulz steps must be between 1 and {}, got {}", kMaxNsSteps, steps));
  }
  if (required_steps && steps != *required_steps) {
    throw Error(fmt::format("coefficient set '{}' requires exactly {} steps, got {}", name,
                            *required_steps, steps));
  }
}

void CoefficientSet::validate_values() const {
  for (std::size_t i = 0; i < table.size(); ++i) {
    const NsCoefficients& t = table[i];
    for (const auto& [key, v] : {std::pair{"a", t.a}, std::pair{"b", t.b}, std::pair{"c", t.c}}) {
      if (!std::isfinite(v) || std::abs(v) > kMaxCoefficientMagnitude) {
        throw Error(fmt::format(
            "coefficient set '{}': tuple {} ({}, {}, {}) has {} = {}: each coefficient must be "
            "finite with a magnitude of at most {}",
            name, i + 1, t.a, t.b, t.c, key, v, kMaxCoefficientMagnitude));
      }
    }
  }
}

std::vector<std::string> coefficient_set_names() {
  std::vector<std::string> names;
  for (const auto& [name, set] : registry())
    names.push_back(name);
  names.push_back("custom");
  return names;
}

const CoefficientSet& coefficient_set(std::string_view name) {
  const auto& sets = registry();
  if (auto it = sets.find(name); it != sets.end()) return it->second;
  throw Error(
      fmt::format("unknown coefficient set '{}'; valid: {} (custom takes a list of a,b,c tuples)",
                  name, fmt::join(coefficient_set_names(), ", ")));
}

CoefficientSet custom_coefficients(std::vector<NsCoefficients> table) {
  if (table.empty()) throw Error("custom coefficient set needs at least one (a, b, c) tuple");
  CoefficientSet set{"custom", std::move(table), Tail::kCycle, {}};
  set.validate_values();
  // A published table given as custom coefficients (torch.optim.Muon's default tuple is
  // simple's) is held to that set's band and step counts, not to the custom band.
  for (const auto& [name, builtin] : registry()) {
    const bool same_run = builtin.tail == Tail::kCycle || builtin.table.size() == 1;
    if (builtin.table == set.table && same_run) {
      set.band_lo = builtin.band_lo;
      set.band_hi = builtin.band_hi;
      set.required_steps = builtin.required_steps;
      break;
    }
  }
  return set;
}

CoefficientSet parse_custom_coefficients(std::string_view text) {
  std::vector<NsCoefficients> table;
  std::vector<double> values;
  std::string token;
  auto flush_value = [&] {
    if (token.empty()) throw Error(fmt::format("custom coefficients '{}': empty value", text));
    double v = 0;
    const auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), v);
    if (ec != std::errc() || ptr != token.data() + token.size()) {
      throw Error(fmt::format("custom coefficients '{}': '{}' is not a number", text, token));
    }
    values.push_back(v);
    token.clear();
  };
  auto flush_tuple = [&] {
    flush_value();
    if (values.size() != 3) {
      throw Error(fmt::format(
          "custom coefficients '{}': each tuple needs 3 values a,b,c separated by ';'", text));
    }
    table.push_back({values[0], values[1], values[2]});
    values.clear();
  };
  for (char ch : text) {
    if (ch == ' ') continue;
    if (ch == ',')
      flush_value();
    else if (ch == ';')
      flush_tuple();
    else
      token.push_back(ch);
  }
  flush_tuple();
  return custom_coefficients(std::move(table));
}

void NsOptions::validate() const {
  if (coefficients.table.empty()) throw Error("Newton-Schulz options: empty coefficient set");
  coefficients.validate_values();
  coefficients.validate_steps(steps);
  coefficients.validate_schedule(steps, precision);
  if (!(eps > 0)) throw Error(fmt::format("Newton-Schulz options: eps must be > 0, got {}", eps));
  if (algorithm == NsAlgorithm::kAuto) {
    throw Error(
        "Newton-Schulz options: algorithm 'auto' is chosen per weight by the optimizer's "
        "tp_mode=auto; a Newton-Schulz run needs standard or gram");
  }
  if (gram_restart < 0) {
    throw Error(fmt::format(
        "Newton-Schulz options: gram_restart must be >= 0 (0 = automatic), got {}", gram_restart));
  }
}

}  // namespace distmuon
