#pragma once
// Communicators for Python: distmuon.Communicator (the C++ value type), and its factories.
#include <pybind11/pybind11.h>

#include "distmuon/comm.h"

namespace distmuon::python {

namespace py = pybind11;

// A communicator over an mpi4py communicator (MPI.COMM_WORLD or a split of it).
Communicator mpi4py_communicator(py::handle comm);
// A communicator whose collectives call the methods of a Python object (distmuon._torch_comm:
// torch.distributed over a process group): rank(), size(), all_gather(send, recv),
// all_reduce(buf, op), reduce_scatter(send, recv, op), broadcast(buf, root),
// all_to_all_v(send, send_counts, recv, recv_counts) (packed buffers), barrier(),
// split(color, key) -> a new such object, abort(code), and optionally placement() -> (the
// group's ranks in its world in group order, the world's size) (CommImpl::placement). Buffers
// arrive as NumPy arrays over distmuon's memory (no copy); the GIL is taken around each call.
Communicator callback_communicator(py::object impl);

void init_comm(py::module_& m);

}  // namespace distmuon::python
