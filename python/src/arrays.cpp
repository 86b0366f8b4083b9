#include "arrays.h"

#include <fmt/format.h>

#include "distmuon/error.h"

namespace distmuon::python {
namespace {

MatrixView checked_view(const py::array& a, const std::string& what) {
  if (!a.dtype().is(py::dtype::of<float>())) {
    throw Error(fmt::format("{}: expected a float32 array, got dtype {}", what,
                            py::str(a.dtype()).cast<std::string>()));
  }
  if (a.ndim() != 2) {
    throw Error(fmt::format("{}: expected a 2-D array, got {} dimension(s)", what, a.ndim()));
  }
  const auto rows = static_cast<Index>(a.shape(0)), cols = static_cast<Index>(a.shape(1));
  const auto s0 = a.strides(0), s1 = a.strides(1);
  const auto elem = static_cast<py::ssize_t>(sizeof(float));
  const bool unit_cols = cols <= 1 || s1 == elem;
  const bool rows_ok = rows <= 1 || (s0 % elem == 0 && s0 / elem >= cols);
  if (!unit_cols || !rows_ok) {
    throw Error(fmt::format(
        "{}: a {} array with strides ({}, {}) bytes is not row-major with unit column stride "
        "(make it contiguous, or pass allow_copy=True where offered)",
        what, shape_str(rows, cols), s0, s1));
  }
  const Index ld = rows <= 1 ? cols : static_cast<Index>(s0 / elem);
  return {static_cast<float*>(const_cast<void*>(a.data())), rows, cols, ld};
}

}  // namespace

ConstMatrixView const_view(const py::array& a, const std::string& what) {
  return checked_view(a, what);
}

MatrixView mutable_view(const py::array& a, const std::string& what) {
  if (!a.writeable()) throw Error(fmt::format("{}: the array is read-only", what));
  return checked_view(a, what);
}

py::array wrap(MatrixView v, py::handle owner) {
  return py::array(
      py::dtype::of<float>(), {v.rows, v.cols},
      {static_cast<py::ssize_t>(v.ld * sizeof(float)), static_cast<py::ssize_t>(sizeof(float))},
      v.data, owner);
}

void init_arrays(py::module_& m) {
  // The address distmuon reads for an array (the zero-copy tests compare it with the array's).
  m.def(
      "_view_address",
      [](const py::array& a) {
        return reinterpret_cast<std::uintptr_t>(const_view(a, "_view_address").data);
      },
      py::arg("array"));
}

}  // namespace distmuon::python
