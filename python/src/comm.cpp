// distmuon.Communicator and the process groups (TP x GTP x replicas) built from one.
#include "comm.h"

#include <pybind11/stl.h>

#include "distmuon/agreement.h"
#include "distmuon/tp.h"

namespace distmuon::python {

void init_comm(py::module_& m) {
  py::class_<Communicator>(m, "Communicator",
                           "A group of ranks (local, MPI through mpi4py, or torch.distributed)")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("backend", &Communicator::backend)
      .def(
          "split", [](const Communicator& c, int color, int key) { return c.split(color, key); },
          py::arg("color"), py::arg("key"), py::call_guard<py::gil_scoped_release>())
      .def("barrier", &Communicator::barrier, py::call_guard<py::gil_scoped_release>())
      .def(
          "all_reduce_sum", [](const Communicator& c, double v) { return c.all_reduce(v); },
          py::arg("value"), py::call_guard<py::gil_scoped_release>())
      .def(
          "agree_or_throw",
          [](const Communicator& c, bool ok, const std::string& what, const std::string& reason) {
            agree_or_throw(c, ok, what, reason);
          },
          py::arg("ok"), py::arg("what"), py::arg("reason") = std::string(),
          py::call_guard<py::gil_scoped_release>(),
          "Collective: raises CollectiveError on every rank when ok is False on any rank, "
          "naming the failing ranks and the first one's reason")
      .def(
          "agree_on",
          [](const Communicator& c, const std::string& value, const std::string& what) {
            agree_on(c, value, what);
          },
          py::arg("value"), py::arg("what"), py::call_guard<py::gil_scoped_release>(),
          "Collective: raises CollectiveError on every rank unless every rank passes the same "
          "value (compared by its FNV-1a 64 hash), naming the ranks that differ from rank 0")
      .def("__repr__", [](const Communicator& c) {
        return "<distmuon.Communicator " + c.backend() + " rank " + std::to_string(c.rank()) +
               " of " + std::to_string(c.size()) + ">";
      });
  m.def("local_communicator", &local_communicator);
  m.def("mpi4py_communicator", &mpi4py_communicator, py::arg("comm"));
  m.def("callback_communicator", &callback_communicator, py::arg("impl"));

  py::class_<ProcessGroups>(m, "ProcessGroups")
      .def_readonly("world", &ProcessGroups::world)
      .def_readonly("tp", &ProcessGroups::tp)
      .def_readonly("gtp", &ProcessGroups::gtp)
      .def_readonly("dp", &ProcessGroups::dp)
      .def_readonly("tp_size", &ProcessGroups::tp_size)
      .def_readonly("gtp_size", &ProcessGroups::gtp_size)
      .def_readonly("replicas", &ProcessGroups::replicas);
  m.def("make_process_groups", &make_process_groups, py::arg("world"), py::arg("tp_size"),
        py::arg("gtp_size"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace distmuon::python
