// The planner, the hardware profiles and calibration, as JSON documents the Python layer turns
// into objects (distmuon.plan, distmuon.profiles, distmuon.calibrate).
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm.h"
#include "device.h"
#include "distmuon/agreement.h"
#include "distmuon/calibrate.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/model_preset.h"
#include "distmuon/plan.h"

namespace distmuon::python {

void init_plan(py::module_& m) {
  // shapes: (name, m, n, count, expert) per weight; or model: a preset name or JSON file.
  m.def(
      "plan",
      [](const std::vector<std::tuple<std::string, Index, Index, Index, bool>>& shapes,
         const std::string& model, int group_size, const std::string& profile,
         std::optional<bool> crosses_domain, int partition_dim, int steps, bool use_syrk,
         int elem_size, const std::string& algorithm, const std::string& cost_model) {
        if (shapes.empty() == model.empty()) throw Error("plan: give either shapes or a model");
        PlanOptions opts;
        opts.group_size = group_size;
        opts.partition_dim = partition_dim;
        opts.steps = steps;
        opts.use_syrk = use_syrk;
        opts.elem_size = elem_size;
        opts.algorithm = parse_ns_algorithm(algorithm);
        opts.model = parse_cost_model(cost_model);
        opts.profile = resolve_profile(profile);
        // As `distmuon plan`: a group larger than the profile's domain crosses it.
        opts.crosses_domain = crosses_domain.value_or(opts.profile.has_value() &&
                                                      group_size > opts.profile->domain_size);
        std::vector<WeightShape> weights;
        if (!model.empty()) {
          weights = model_weights(model);
        } else {
          for (const auto& [name, rows, cols, count, expert] : shapes)
            weights.push_back({name, rows, cols, count, expert});
        }
        const Plan plan = make_plan(weights, opts);
        return std::make_pair(nlohmann::json(plan).dump(), format_plan(plan));
      },
      py::arg("shapes"), py::arg("model"), py::arg("group_size"), py::arg("profile"),
      py::arg("crosses_domain"), py::arg("partition_dim"), py::arg("steps"), py::arg("syrk"),
      py::arg("elem_size"), py::arg("algorithm"), py::arg("cost_model"));
  m.def("profiles", [] {
    nlohmann::json out = nlohmann::json::array();
    for (const HardwareProfile& p : builtin_profiles())
      out.push_back(p);
    return out.dump();
  });
  // out: the profile file rank 0 writes (atomically, as `distmuon calibrate --out`). Its folder
  // and kind are checked on rank 0 before the measurements, and both the check and the write
  // are agreed on: every rank raises when rank 0 cannot write it.
  m.def(
      "calibrate",
      [](const Communicator& group, const std::string& name, std::vector<Index> sizes,
         std::size_t max_bytes, const std::optional<std::string>& out, Backend backend) {
        CalibrateOptions o;
        o.name = name;
        if (!sizes.empty()) o.sizes = std::move(sizes);
        if (max_bytes > 0) o.max_bytes = max_bytes;
        o.validate();
        py::gil_scoped_release release;
        if (out) {
          run_on_root(group, "calibrate", [&] {
            const std::filesystem::path path = *out;
            if (path.empty()) throw Error("calibrate: out is an empty path");
            const auto dir =
                path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
            std::error_code ec;
            if (!std::filesystem::is_directory(dir, ec)) {
              throw Error(fmt::format("calibrate: out {}: folder {} does not exist", path.string(),
                                      dir.string()));
            }
            check_output_file(path, "calibrate: out");
          });
        }
        const CalibrationReport r = calibrate(group, o, *backend.compute);
        if (out) {
          run_on_root(group, "calibrate: writing the profile",
                      [&] { save_profile(r.profile, *out); });
        }
        return std::make_pair(nlohmann::json(r.profile).dump(), format_calibration(r));
      },
      py::arg("group"), py::arg("name"), py::arg("sizes"), py::arg("max_bytes"), py::arg("out"),
      py::arg("backend"));
}

}  // namespace distmuon::python
