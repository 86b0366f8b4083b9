#include <fmt/format.h>

#include "cli_checks.h"
#include "commands.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon::cli {

void NsCliOptions::add_to(CLI::App& app, const std::string& auto_help) {
  app.add_option("--coefficients", coefficients,
                 "Coefficient set: simple, quintic, polar_express, cans, aol, "
                 "deepseekv4, cubic5, custom")
      ->capture_default_str();
  app.add_option("--custom-coefficients", custom, "With --coefficients custom: 'a,b,c;a,b,c;...'");
  app.add_option("--steps", steps,
                 "Newton-Schulz steps (>= 1, a count the coefficient set supports: "
                 "docs/optimizer.md)")
      ->capture_default_str();
  app.add_flag("--syrk,!--no-syrk", syrk, "Symmetric products with BLAS syrk (default) or gemm")
      ->capture_default_str();
  std::vector<std::string> algorithms{"standard", "gram"};
  if (!auto_help.empty()) algorithms.push_back("auto");
  app.add_option("--ns-algorithm", algorithm,
                 "Newton-Schulz algorithm: standard, or gram (the iteration on s x s matrices "
                 "only, faster within its fp32 error; docs/gram-newton-schulz.md)" +
                     (auto_help.empty() ? std::string() : "; " + auto_help))
      ->check(CLI::IsMember(algorithms))
      ->capture_default_str();
  app.add_option(
         "--gram-restart", gram_restart,
         "With --ns-algorithm gram: re-form the Gram matrix every N steps (0 = automatically, when "
         "rounding errors could have grown past kGramGrowthLimit)")
      ->check(at_least<int>(0))
      ->capture_default_str();
  app.add_option("--precision", precision,
                 "Arithmetic of Newton-Schulz's products: fp32, tf32 (10-bit mantissa operands), "
                 "bf16 (7-bit), each accumulated in fp32, or auto (the device's default: fp32 on "
                 "cpu and opaque, which emulate tf32 and bf16, bf16 on cuda; docs/precision.md)")
      ->check(CLI::IsMember(names_of<Precision>({"auto"})))
      ->capture_default_str();
}

Precision NsCliOptions::precision_on(const Compute& compute) const {
  return precision == "auto" ? compute.default_precision() : parse_precision(precision);
}

NsOptions NsCliOptions::resolve() const {
  NsOptions o;
  if (coefficients == "custom") {
    if (custom.empty())
      throw Error("--coefficients custom needs --custom-coefficients 'a,b,c;...'");
    o.coefficients = parse_custom_coefficients(custom);
  } else {
    if (!custom.empty())
      throw Error("--custom-coefficients is only valid with --coefficients custom");
    o.coefficients = coefficient_set(coefficients);
  }
  o.steps = steps;
  o.use_syrk = syrk;
  o.algorithm = parse_ns_algorithm(algorithm);
  if (o.algorithm == NsAlgorithm::kAuto)
    throw Error("--ns-algorithm auto applies to tp-mode auto (bench --model, train) only");
  o.gram_restart = gram_restart;
  if (precision != "auto") o.precision = parse_precision(precision);
  o.validate();
  return o;
}

void check_ns_result(ConstMatrixView x, const NsOptions& opts, Compute& compute) {
  if (const auto at = compute.find_non_finite(x)) {
    throw Error(fmt::format(
        "the Newton-Schulz result ({}) has a non-finite value at ({}, {}) (coefficient set '{}' "
        "with {} steps, checked to orthogonalise: a non-finite input or a norm that overflows)",
        shape_str(x), at->row, at->col, opts.coefficients.name, opts.steps));
  }
}

}  // namespace distmuon::cli
