// distmuon.Muon: the optimizer over this rank's shards, given as float32 arrays updated in place.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "arrays.h"
#include "comm.h"
#include "device.h"
#include "distmuon/error.h"
#include "distmuon/muon.h"

namespace distmuon::python {
namespace {

// Options from `base` patched by a JSON object of the fields given (MuonOptions' JSON names;
// "adamw" a nested object). An unknown field is an error.
MuonOptions options_from(const std::string& overrides, const MuonOptions& base = {}) {
  nlohmann::json j = base;
  const nlohmann::json patch = nlohmann::json::parse(overrides);
  for (const auto& [key, value] : patch.items()) {
    if (!j.contains(key)) {
      std::string valid;
      for (const auto& [k, v] : j.items())
        valid += (valid.empty() ? "" : ", ") + k;
      throw Error(fmt::format("Muon: unknown option '{}' (valid: {})", key, valid));
    }
    if (key == "adamw") {
      for (const auto& [k, v] : value.items()) {
        if (!j["adamw"].contains(k)) throw Error(fmt::format("Muon: unknown adamw option '{}'", k));
      }
    }
  }
  j.merge_patch(patch);
  MuonOptions o = j.get<MuonOptions>();
  o.validate();
  return o;
}

// The optimizer on a backend (device.h) and the caller's matrices it updates (kept alive here):
// views of them where the backend addresses them, else staged copies uploaded before each step
// and the parameters downloaded after it.
class PyMuon {
 public:
  PyMuon(const std::string& options, Communicator world, Backend backend)
      : backend_(backend), muon_(options_from(options), std::move(world), *backend.compute) {}

  std::size_t add_parameter(const py::object& shard, const std::string& name, Index rows,
                            Index cols, const std::string& role, bool use_muon,
                            std::optional<int> tp_dim, std::optional<Communicator> tp_group,
                            std::optional<Communicator> gtp_group, Index pad, bool expert,
                            int expert_rank, std::vector<Index> qkv_split, Index tp_pad,
                            std::optional<Communicator> dp_group, Index batch, bool bf16) {
    const std::string what = fmt::format("Muon parameter '{}'", name);
    std::unique_ptr<BackendMatrix> param;
    ParamSpec spec;
    spec.name = name;
    if (bf16) {  // updated where it lies, through a float32 copy made for each step
      Index r = 0, c = 0;
      spec.bf16 = bf16_storage(backend_, shard, what, r, c);
      spec.local = {nullptr, r, c, c};
    } else {
      param = std::make_unique<BackendMatrix>(backend_, shard, what, true);
      spec.local = param->view();
    }
    spec.rows = rows;
    spec.cols = cols;
    try {
      spec.role = parse_param_role(role);
    } catch (const Error& e) {
      throw Error(fmt::format("Muon parameter '{}': {}", name, e.what()));
    }
    spec.use_muon = use_muon;
    spec.tp_partition_dim = tp_dim.value_or(kNoPartition);
    if (tp_dim && !tp_group) {
      throw Error(fmt::format("Muon parameter '{}': tp_dim {} needs a tp_group", name, *tp_dim));
    }
    spec.tp_group = std::move(tp_group);
    spec.gtp_sharded = gtp_group.has_value();
    spec.gtp_group = std::move(gtp_group);
    spec.pad_length = pad;
    spec.tp_pad_length = tp_pad;
    spec.expert = expert;
    spec.expert_rank = expert_rank;
    spec.qkv_split = std::move(qkv_split);
    spec.dp_group = std::move(dp_group);
    spec.batch = batch;
    const std::size_t i = muon_.add_parameter(std::move(spec));
    if (param) {
      param->upload();
      params_.push_back(std::move(param));
    } else {
      bf16_.push_back(py::reinterpret_borrow<py::object>(shard));
    }
    grad_store_.emplace_back();
    names_.push_back(name);
    return i;
  }

  // failure: the caller's own checks failed on this rank (grads unused). It, or a gradient this
  // rank cannot view, is agreed inside the step: every rank raises, none is left waiting.
  // active: empty (every parameter) or one flag per parameter; an inactive parameter's entry in
  // grads is None (not read) and it does not step (agreed over the world).
  void step(const std::vector<py::object>& grads, const std::string& failure,
            const std::vector<std::uint8_t>& active) {
    std::vector<ConstMatrixView> views;
    std::vector<BackendMatrix> staged;
    std::string reason = failure;
    if (reason.empty()) {
      try {
        for (std::size_t i = 0; i < grads.size(); ++i) {
          if (grads[i].is_none()) {
            if (i < active.size() && active[i] == 0) continue;  // an empty view below
            throw Error(fmt::format("no gradient for active parameter {}", i));
          }
          staged.emplace_back(backend_, grads[i],
                              i < names_.size() ? fmt::format("gradient of '{}'", names_[i])
                                                : fmt::format("gradient {}", i),
                              false, i < grad_store_.size() ? &grad_store_[i] : nullptr);
        }
      } catch (const std::exception& e) {  // a refused view or a non-array: agreed in the step
        reason = e.what();
      }
    }
    py::gil_scoped_release release;
    if (!reason.empty()) {
      staged.clear();
    } else {
      for (auto& p : params_)
        p->upload();  // the caller may have changed its parameters since the last step
    }
    std::size_t k = 0;
    for (std::size_t i = 0; reason.empty() && i < grads.size(); ++i) {
      if (i < active.size() && active[i] == 0 && grads[i].is_none()) {
        views.emplace_back();
        continue;
      }
      staged[k].upload();
      views.push_back(staged[k++].view());
    }
    muon_.step(views, reason, active);
    for (auto& p : params_)
      p->download();
  }

  // New options for the next steps: the current ones patched by a JSON object (the fields that
  // fix the plan refused, see Muon::set_options). Nothing changes on a refusal.
  void set_options(const std::string& patch) {
    muon_.set_options(options_from(patch, muon_.options()));
  }

  // Seconds of each of `count` steps run back to back in C++ on the same gradients (the
  // overhead benchmark's C++ side: no Python between or inside the steps). A gradient this rank
  // cannot view is agreed in the first step, as in step(): every rank raises.
  std::vector<double> time_steps(const std::vector<py::object>& grads, int count) {
    std::vector<BackendMatrix> staged;
    std::vector<ConstMatrixView> views;
    std::string reason;
    try {
      for (std::size_t i = 0; i < grads.size(); ++i) {
        staged.emplace_back(backend_, grads[i], fmt::format("gradient {}", i), false);
      }
    } catch (const std::exception& e) {  // a refused view or a non-array: agreed in the step
      reason = e.what();
      staged.clear();
    }
    std::vector<double> out;
    py::gil_scoped_release release;
    for (auto& g : staged) {
      g.upload();
      views.push_back(g.view());
    }
    for (int k = 0; k < count; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      muon_.step(views, reason);
      out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return out;
  }

  // Parameter i's state tensors: arrays over the optimizer's memory (no copy) on a host backend,
  // downloaded copies on a device backend (write_state changes them). A momentum kept in
  // bfloat16 (Muon::momentum_bf16) is a uint16 array of its bits (torch views it as bfloat16).
  std::vector<py::array> state_tensors(std::size_t i, py::handle self) {
    std::vector<py::array> out;
    if (const auto m = muon_.momentum_bf16(i)) {
      const auto rows = static_cast<py::ssize_t>(m->rows), cols = static_cast<py::ssize_t>(m->cols);
      if (backend_.host()) {
        out.push_back(py::array(py::dtype::of<std::uint16_t>(), {rows, cols},
                                {cols * 2, py::ssize_t{2}}, m->data, self));
        return out;
      }
      Matrix values;
      {
        py::gil_scoped_release release;
        values = muon_.state_to_host(i, 0);
      }
      py::array_t<std::uint16_t> copy({rows, cols});
      auto* dst = copy.mutable_data();
      for (const float v : values.values())  // exact: the values are bfloat16's
        *dst++ = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v) >> 16);
      out.push_back(std::move(copy));
      return out;
    }
    for (MatrixView v : muon_.state_tensors(i)) {
      if (backend_.host()) {
        out.push_back(wrap(v, self));
        continue;
      }
      py::array_t<float> copy({v.rows, v.cols});
      const MatrixView host{copy.mutable_data(), v.rows, v.cols, v.cols};
      {
        py::gil_scoped_release release;
        backend_.compute->copy_to_host(v, host);
      }
      out.push_back(std::move(copy));
    }
    return out;
  }

  // State tensor k of parameter i = value (a float32 array of its shape), on any backend (a
  // momentum kept in bfloat16 rounded to it).
  void write_state(std::size_t i, std::size_t k, const py::array& value) {
    if (muon_.momentum_bf16(i)) {
      const ConstMatrixView src = const_view(value, fmt::format("state {} of parameter {}", k, i));
      py::gil_scoped_release release;
      muon_.state_from_host(i, k, src);
      return;
    }
    const auto tensors = muon_.state_tensors(i);
    if (k >= tensors.size()) {
      throw Error(fmt::format("Muon: parameter {} has {} state tensor(s), not {}", i,
                              tensors.size(), k + 1));
    }
    const MatrixView dst = tensors[k];
    const ConstMatrixView src = const_view(value, fmt::format("state {} of parameter {}", k, i));
    if (src.rows != dst.rows || src.cols != dst.cols) {
      throw Error(fmt::format("Muon: state {} of parameter {} is {}, given {}", k, i,
                              shape_str(dst.rows, dst.cols), shape_str(src)));
    }
    py::gil_scoped_release release;
    if (backend_.host()) {
      backend_.compute->copy(src, dst);
    } else {
      backend_.compute->copy_from_host(src, dst);
    }
  }

  Muon& muon() { return muon_; }

 private:
  Backend backend_;
  Muon muon_;
  std::vector<std::unique_ptr<BackendMatrix>> params_;  // the float32 parameters
  std::vector<py::object> bf16_;          // the bfloat16 parameters' memory, kept alive
  std::vector<DeviceMatrix> grad_store_;  // staged gradients: one buffer per parameter, kept
  std::vector<std::string> names_;
};

py::dict param_info(const ParamInfo& p) {
  py::dict d;
  d["name"] = p.name;
  d["muon"] = p.muon;
  d["rows"] = p.rows;
  d["cols"] = p.cols;
  d["tp_size"] = p.tp_size;
  d["gtp_size"] = p.gtp_size;
  d["mode"] = p.mode ? py::object(py::str(to_string(*p.mode))) : py::object(py::none());
  d["algorithm"] =
      p.muon && p.mode ? py::object(py::str(to_string(p.algorithm))) : py::object(py::none());
  d["crosses_domain"] =
      p.crosses_domain ? py::object(py::bool_(*p.crosses_domain)) : py::object(py::none());
  d["dp_size"] = p.dp_size;
  d["home"] = p.home;
  d["owner"] = p.owner;
  d["batch"] = p.batch;
  d["owners"] = p.owners;
  return d;
}

}  // namespace

void init_muon(py::module_& m) {
  py::class_<PyMuon>(m, "MuonCore")
      .def(py::init<const std::string&, Communicator, Backend>(), py::arg("options"),
           py::arg("world"), py::arg("backend"))
      .def("add_parameter", &PyMuon::add_parameter, py::arg("shard"), py::arg("name"),
           py::arg("rows"), py::arg("cols"), py::arg("role"), py::arg("use_muon"),
           py::arg("tp_dim"), py::arg("tp_group"), py::arg("gtp_group"), py::arg("pad"),
           py::arg("expert"), py::arg("expert_rank"), py::arg("qkv_split"), py::arg("tp_pad") = 0,
           py::arg("dp_group") = py::none(), py::arg("batch") = 1, py::arg("bf16") = false)
      .def("step", &PyMuon::step, py::arg("grads"), py::arg("failure") = std::string(),
           py::arg("active") = std::vector<std::uint8_t>())
      .def("set_options", &PyMuon::set_options, py::arg("patch"))
      .def(
          "check_options",
          [](PyMuon& s, const std::string& patch) {
            (void)options_from(patch, s.muon().options());
          },
          py::arg("patch"))
      .def("time_steps", &PyMuon::time_steps, py::arg("grads"), py::arg("count"))
      .def("write_state", &PyMuon::write_state, py::arg("index"), py::arg("k"), py::arg("value"))
      .def("save",
           [](PyMuon& s, const std::string& dir) {
             py::gil_scoped_release release;
             s.muon().save(dir);
           })
      .def("load",
           [](PyMuon& s, const std::string& dir) {
             py::gil_scoped_release release;
             s.muon().load(dir);
           })
      .def("state_tensors",
           [](py::object self, std::size_t i) {
             return self.cast<PyMuon&>().state_tensors(i, self);
           })
      .def_property(
          "step_count", [](PyMuon& s) { return s.muon().step_count(); },
          [](PyMuon& s, std::int64_t step) { s.muon().set_step_count(step); })
      .def("set_learning_rates",
           [](PyMuon& s, double lr, double adamw_lr) { s.muon().set_learning_rates(lr, adamw_lr); })
      .def("set_weight_decays",
           [](PyMuon& s, double wd, double adamw_wd) { s.muon().set_weight_decays(wd, adamw_wd); })
      .def("options", [](PyMuon& s) { return nlohmann::json(s.muon().options()).dump(); })
      .def("parameters",
           [](PyMuon& s) {
             py::list out;
             for (const ParamInfo& p : s.muon().parameters())
               out.append(param_info(p));
             return out;
           })
      .def("last_step_stats", [](PyMuon& s) {
        const MuonStepStats st = s.muon().last_step_stats();
        return py::make_tuple(st.total_s, st.comm_s);
      });
}

}  // namespace distmuon::python
