// distmuon.newton_schulz: the NS of one float32 matrix, as `distmuon orthogonalize` runs it on one
// rank (newton_schulz_tp over a group of one, duplicated mode), on the caller's memory.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <array>
#include <utility>
#include <vector>

#include "arrays.h"
#include "device.h"
#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"

namespace distmuon::python {
namespace {

// The options of MuonOptions::ns_options: one set of rules for the optimizer and this call.
NsOptions ns_options(const std::string& coefficients,
                     const std::vector<std::array<double, 3>>& custom, int steps,
                     const std::string& algorithm, bool use_syrk, int gram_restart,
                     const std::string& precision, const Compute& compute) {
  MuonOptions m;
  m.coefficients = coefficients;
  if (coefficients == "custom") {
    if (custom.empty())
      throw Error("newton_schulz: coefficients 'custom' needs a list of (a, b, c)");
    // Shortest round-trip text: parse_custom_coefficients reads back the same doubles.
    for (const auto& t : custom)
      m.custom_coefficients +=
          fmt::format("{}{},{},{}", m.custom_coefficients.empty() ? "" : ";", t[0], t[1], t[2]);
  }
  m.steps = steps;
  m.use_syrk = use_syrk;
  m.ns_algorithm = parse_ns_algorithm(algorithm);
  m.gram_restart = gram_restart;
  // "auto": the backend's default (fp32 on the CPU, which emulates tf32 and bf16).
  if (precision != "auto") {
    try {
      m.precision = parse_precision(precision);
    } catch (const Error& e) {
      throw Error(fmt::format("newton_schulz: precision: {} (or auto)", e.what()));
    }
  }
  NsOptions o = m.ns_options(compute.default_precision());
  // MuonOptions runs "auto" as standard outside tp_mode auto; a single matrix has no such mode.
  o.algorithm = m.ns_algorithm;
  o.validate();
  return o;
}

}  // namespace

void init_ns(py::module_& m) {
  // out = NS(x) on `backend`; out may be x itself (in place). Both are the caller's matrices
  // (device.h): computed on where they lie (cpu: NumPy arrays; cuda: CUDA tensors, queued on the
  // backend's stream), or staged through the backend's memory (opaque: uploaded, downloaded).
  m.def(
      "newton_schulz",
      [](const py::object& x, const py::object& out, Backend backend,
         const std::string& coefficients, const std::vector<std::array<double, 3>>& custom,
         int steps, const std::string& algorithm, bool use_syrk, int gram_restart,
         const std::string& precision) {
        const NsOptions opts = ns_options(coefficients, custom, steps, algorithm, use_syrk,
                                          gram_restart, precision, *backend.compute);
        BackendMatrix in(backend, x, "newton_schulz input", false);
        BackendMatrix dst(backend, out, "newton_schulz output", true);
        const MatrixView src = in.caller(), to = dst.caller();
        if (to.rows != src.rows || to.cols != src.cols) {
          throw Error(fmt::format("newton_schulz: output {} for an input {}", shape_str(to),
                                  shape_str(src)));
        }
        py::gil_scoped_release release;
        Compute& compute = *backend.compute;
        if (dst.staged()) {  // the caller's out changes only at the download, after success
          if (to.data == src.data) {
            dst.upload();
          } else {
            dst.upload(src);  // the input straight into the output's copy
          }
          newton_schulz_tp(dst.view(), 0, local_communicator(), TpMode::kDuplicated, opts, compute);
          dst.download();
          return;
        }
        // NS runs on a working copy, copied into out only once it succeeded: a refused input
        // (not finite, a norm that overflows) leaves the caller's out (or x, in place) unchanged.
        DeviceMatrix work(compute, src.rows, src.cols);
        compute.copy(in.view(), work.view());
        newton_schulz_tp(work.view(), 0, local_communicator(), TpMode::kDuplicated, opts, compute);
        compute.copy(std::as_const(work).view(), dst.view());
      },
      py::arg("x"), py::arg("out"), py::arg("backend"), py::arg("coefficients"), py::arg("custom"),
      py::arg("steps"), py::arg("algorithm"), py::arg("syrk"), py::arg("gram_restart"),
      py::arg("precision"));
  m.def("coefficient_sets", &coefficient_set_names);
  m.def("precision_names", [] { return std::string(precision_names()); });
  m.def("ns_flops", [](Index m_, Index n, int steps, bool use_syrk) {
    return ns_flops(m_, n, steps, use_syrk);
  });
}

}  // namespace distmuon::python
