// distmuon._core: the C++ library for Python (docs/python.md). One file per concept: arrays
// (zero-copy views), device (backends and their memory), ns, comm (+ the mpi4py and
// torch.distributed backends), muon, plan, log (the library's log lines, for Python's logging).
// distmuon::Error arrives as distmuon.Error (a RuntimeError) with the same message,
// CollectiveError as distmuon.CollectiveError (a subclass) carrying its scope: is_world (every
// rank of the world raised it), ranks (the world ranks of the group that agreed on it, when
// known) and scope (described in words).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "arrays.h"
#include "comm.h"
#include "distmuon/error.h"

namespace distmuon::python {
void init_device(py::module_& m);
void init_ns(py::module_& m);
void init_muon(py::module_& m);
void init_plan(py::module_& m);
void init_comm_collectives(py::module_& m);
void init_log(py::module_& m);
}  // namespace distmuon::python

PYBIND11_MODULE(_core, m) {
  namespace py = pybind11;
  using namespace distmuon::python;
  m.doc() = "distmuon: Muon on sharded weights (C++ core)";
  static py::exception<distmuon::Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<distmuon::CollectiveError> collective(m, "CollectiveError", error.ptr());
  // Most derived first: the translator tries the catch clauses in order.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const distmuon::CollectiveError& e) {
      // An instance with the scope's attributes: a program must abort the job unless is_world
      // (docs/python.md, "Errors").
      py::object raised = py::handle(collective.ptr())(e.what());
      raised.attr("is_world") = e.scope().is_world();
      raised.attr("ranks") = e.scope().ranks;
      raised.attr("scope") = e.scope().describe();
      PyErr_SetObject(collective.ptr(), raised.ptr());
    } catch (const distmuon::Error& e) {
      py::set_error(error, e.what());
    }
  });
  init_log(m);
  init_arrays(m);
  init_device(m);
  init_ns(m);
  init_comm(m);
  init_comm_collectives(m);
  init_muon(m);
  init_plan(m);
}
