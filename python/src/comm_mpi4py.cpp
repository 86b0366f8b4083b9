// mpi4py communicators as distmuon communicators. MPI was initialised by mpi4py (importing
// mpi4py.MPI); distmuon duplicates the communicator and never initialises or finalises MPI.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <mpi4py/mpi4py.h>

#include "comm.h"
#include "distmuon/error.h"

namespace distmuon::python {

Communicator mpi4py_communicator(py::handle comm) {
  // mpi4py's C API is imported on first use only: importing it initialises MPI.
  static bool imported = false;
  if (!imported) {
    if (import_mpi4py() < 0) throw py::error_already_set();
    imported = true;
  }
  if (!PyObject_TypeCheck(comm.ptr(), &PyMPIComm_Type)) {
    throw Error("mpi4py_communicator: expected an mpi4py.MPI.Comm, got " +
                py::str(py::type::of(comm)).cast<std::string>());
  }
  MPI_Comm* handle = PyMPIComm_Get(comm.ptr());
  if (handle == nullptr) throw py::error_already_set();
  py::gil_scoped_release release;  // MPI_Comm_dup is collective
  return mpi_communicator(handle);
}

}  // namespace distmuon::python
