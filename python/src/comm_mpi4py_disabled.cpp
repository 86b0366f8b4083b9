// Built when distmuon has no MPI backend or mpi4py's header was not found.
#include "comm.h"
#include "distmuon/error.h"

namespace distmuon::python {

Communicator mpi4py_communicator(py::handle) {
  throw Error(
      "distmuon was built without mpi4py support (DISTMUON_ENABLE_MPI off or mpi4py's header "
      "not found at configure time)");
}

}  // namespace distmuon::python
