// `distmuon precision`: the error of Newton-Schulz at each precision against a float64 run, per
// coefficient set, algorithm and shape (docs/precision.md shows its table). It runs on the cpu
// backend, whose tf32 and bf16 products round their operands as the GPU rounds them and
// accumulate in fp32 (precision.h), so the table is what a GPU computes, up to the order of the
// fp32 sums.
//
// error = ||X - X_64||_F / ||X_64||_F, X the result at the precision, X_64 the standard iteration
// with the same coefficients and steps in float64 (Gram NS included: its exact result is the
// standard one's).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "command_line_errors.h"
#include "commands.h"
#include "distmuon/error.h"

namespace distmuon::cli {
namespace {

// Standard Newton-Schulz in float64 (newton_schulz.h's reference) on g.
std::vector<double> ns_f64(ConstMatrixView g, const NsOptions& o) {
  std::vector<double> values(static_cast<std::size_t>(g.rows * g.cols));
  for (Index i = 0; i < g.rows; ++i)
    for (Index j = 0; j < g.cols; ++j)
      values[static_cast<std::size_t>(i * g.cols + j)] = g(i, j);
  return reference_newton_schulz<double>(values, g.rows, g.cols, o.coefficients, o.steps, o.eps);
}

double error_against(const Matrix& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got.data()[i]) - want[i];
    diff += d * d;
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

// The step count a built-in set is meant for (docs/optimizer.md).
int default_steps(const CoefficientSet& set) {
  if (set.required_steps) return *set.required_steps;
  if (set.name == "polar_express") return 8;
  if (set.name == "deepseekv4") return 10;
  return 5;
}

struct Inputs {
  std::vector<std::pair<Index, Index>> shapes;
  std::vector<NsOptions> sets;
};

}  // namespace

void add_precision_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "precision",
      "Print the error of Newton-Schulz in fp32, tf32 and bf16 (emulated on the CPU) against "
      "float64, per coefficient set, algorithm and shape");
  struct Opts {
    std::vector<std::string> shapes{"96x96", "64x160", "160x64", "5x8"};
    std::vector<std::string> sets{"quintic", "polar_express", "cubic5"};
    std::vector<std::string> algorithms{"standard", "gram"};
    int gram_restart = 0;
    unsigned seed = 7;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--shapes", o->shapes, "Shapes MxN (Gaussian inputs)")->capture_default_str();
  cmd->add_option("--coefficients", o->sets,
                  "Built-in coefficient sets, each at the step count it is meant for")
      ->capture_default_str();
  cmd->add_option("--ns-algorithm", o->algorithms, "Algorithms: standard, gram")
      ->check(CLI::IsMember({"standard", "gram"}))
      ->capture_default_str();
  cmd->add_option("--gram-restart", o->gram_restart,
                  "Gram NS: re-form the Gram matrix every N steps (0 = the automatic rule of "
                  "each precision)")
      ->check(at_least<int>(0))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->callback([o, &ctx] {
    // A pure function of the command line: every rank refuses it alike. Rank 0 prints the table.
    const Inputs in = resolve_on_every_rank([&] {
      Inputs r;
      for (const std::string& s : o->shapes)
        r.shapes.push_back(parse_shape(s, "--shapes", 4096));
      for (const std::string& name : o->sets) {
        NsOptions ns;
        ns.coefficients = coefficient_set(name);
        ns.steps = default_steps(ns.coefficients);
        ns.gram_restart = o->gram_restart;
        ns.validate();
        r.sets.push_back(ns);
      }
      return r;
    });
    if (ctx.world.rank() != 0) return;
    constexpr Precision kPrecisions[] = {Precision::kFp32, Precision::kTf32, Precision::kBf16};
    fmt::print(
        "error = ||X - X_64||_F / ||X_64||_F against float64 standard NS, Gaussian inputs (seed "
        "{}); gram: restarts in brackets\n",
        o->seed);
    fmt::print("{:<14} {:>5} {:<9} {:>8} {:>12} {:>12} {:>12}\n", "coefficients", "steps",
               "algorithm", "shape", "fp32", "tf32", "bf16");
    for (const NsOptions& ns : in.sets) {
      for (const std::string& algorithm : o->algorithms) {
        for (const auto& [m, n] : in.shapes) {
          Matrix g(m, n);
          std::mt19937 rng(o->seed);
          std::normal_distribution<float> dist;
          for (float& v : g.values())
            v = dist(rng);
          const std::vector<double> want = ns_f64(g.view(), ns);
          std::string row = fmt::format("{:<14} {:>5} {:<9} {:>8}", ns.coefficients.name, ns.steps,
                                        algorithm, fmt::format("{}x{}", m, n));
          for (const Precision p : kPrecisions) {
            NsOptions run = ns;
            run.algorithm = parse_ns_algorithm(algorithm);
            run.precision = p;
            const Matrix got = newton_schulz(g.view(), run, cpu_compute());
            std::string cell = fmt::format("{:.1e}", error_against(got, want));
            if (run.algorithm == NsAlgorithm::kGram)
              cell += fmt::format(" [{}]", gram_ns_gram_count(run) - 1);
            row += fmt::format(" {:>12}", cell);
          }
          fmt::print("{}\n", row);
        }
      }
    }
  });
}

}  // namespace distmuon::cli
