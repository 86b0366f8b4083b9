#pragma once
// NumPy arrays as distmuon matrix views, without copies. Accepted: float32, 2-D, rows in memory
// order with unit column stride (C-contiguous, or row-strided views of one). Anything else is
// refused with a distmuon::Error naming the argument, so that no hidden copy is ever made (the
// Python layer makes a copy only when the caller allows it).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "distmuon/matrix.h"

namespace distmuon::python {

namespace py = pybind11;

ConstMatrixView const_view(const py::array& a, const std::string& what);
// Also requires a writeable array.
MatrixView mutable_view(const py::array& a, const std::string& what);
// A float32 NumPy array over memory owned by distmuon (no copy); `owner` keeps it alive.
py::array wrap(MatrixView v, py::handle owner);

void init_arrays(py::module_& m);

}  // namespace distmuon::python
