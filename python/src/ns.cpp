// distmuon.newton_schulz: the NS of one float32 matrix, as `distmuon orthogonalize` runs it on one
// rank (newton_schulz_tp over a group of one, duplicated mode), on the caller's memory.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <array>
#include <vector>

#include "arrays.h"
#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"

namespace distmuon::python {
namespace {

NsOptions ns_options(const std::string& coefficients,
                     const std::vector<std::array<double, 3>>& custom, int steps,
                     const std::string& algorithm, bool use_syrk, int gram_restart,
                     const std::string& precision, const Compute& compute) {
  NsOptions o;
  if (coefficients == "custom") {
    if (custom.empty())
      throw Error("newton_schulz: coefficients 'custom' needs a list of (a, b, c)");
    std::vector<NsCoefficients> table;
    for (const auto& t : custom)
      table.push_back({t[0], t[1], t[2]});
    o.coefficients = custom_coefficients(std::move(table));
  } else {
    o.coefficients = coefficient_set(coefficients);
  }
  o.steps = steps;
  o.use_syrk = use_syrk;
  o.algorithm = parse_ns_algorithm(algorithm);
  o.gram_restart = gram_restart;
  // "auto": the backend's default (fp32 on the CPU, which emulates tf32 and bf16).
  try {
    o.precision = precision == "auto" ? compute.default_precision() : parse_precision(precision);
  } catch (const Error& e) {
    throw Error(fmt::format("newton_schulz: precision: {} (or auto)", e.what()));
  }
  o.validate();
  return o;
}

}  // namespace

void init_ns(py::module_& m) {
  // out = NS(x); out may be x itself (in place). Both are the caller's arrays: no copy but the
  // one of x into out when they differ.
  m.def(
      "newton_schulz",
      [](const py::array& x, const py::array& out, const std::string& coefficients,
         const std::vector<std::array<double, 3>>& custom, int steps, const std::string& algorithm,
         bool use_syrk, int gram_restart, const std::string& precision) {
        Compute& compute = cpu_compute();
        const NsOptions opts = ns_options(coefficients, custom, steps, algorithm, use_syrk,
                                          gram_restart, precision, compute);
        const ConstMatrixView in = const_view(x, "newton_schulz input");
        const MatrixView dst = mutable_view(out, "newton_schulz output");
        if (dst.rows != in.rows || dst.cols != in.cols) {
          throw Error(fmt::format("newton_schulz: output {} for an input {}", shape_str(dst),
                                  shape_str(in)));
        }
        py::gil_scoped_release release;
        if (dst.data != in.data) copy(in, dst);
        newton_schulz_tp(dst, 0, local_communicator(), TpMode::kDuplicated, opts, compute);
      },
      py::arg("x"), py::arg("out"), py::arg("coefficients"), py::arg("custom"), py::arg("steps"),
      py::arg("algorithm"), py::arg("syrk"), py::arg("gram_restart"), py::arg("precision"));
  m.def("coefficient_sets", &coefficient_set_names);
  m.def("ns_flops", [](Index m_, Index n, int steps, bool use_syrk) {
    return ns_flops(m_, n, steps, use_syrk);
  });
}

}  // namespace distmuon::python
