// distmuon.Communicator's collectives on NumPy arrays: the calls distmuon's optimizer makes
// (all_gather, all_reduce, reduce_scatter, broadcast, all_to_all_v), on any backend (local, MPI,
// torch.distributed), for checking a backend end to end and for small exchanges of a caller's
// own. Buffers: 1-D C-contiguous float32, float64, int32, int64 or uint8 arrays, read and written
// where they lie; every size is checked (the Communicator's typed helpers) before the call.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm.h"
#include "comm/comm_names.h"
#include "distmuon/error.h"

namespace distmuon::python {
namespace {

ReduceOp reduce_op(const std::string& op) {
  try {
    return detail::parse_enum<ReduceOp>(op, "reduce op");
  } catch (const Error& e) {
    throw Error(fmt::format("Communicator: {}", e.what()));
  }
}

void check_buffer(const py::array& a, const char* what, bool writes) {
  if (a.ndim() != 1 || !(a.flags() & py::array::c_style)) {
    throw Error(fmt::format("Communicator: {} must be a 1-D C-contiguous array ({} dimension(s))",
                            what, a.ndim()));
  }
  if (writes && !a.writeable()) throw Error(fmt::format("Communicator: {} is read-only", what));
}

// Calls f.template operator()<T>() with T the element type of `a` (checked first).
template <typename F>
void with_dtype(const py::array& a, const char* what, bool writes, F&& f) {
  check_buffer(a, what, writes);
  const py::dtype d = a.dtype();
  if (d.is(py::dtype::of<float>())) return f.template operator()<float>();
  if (d.is(py::dtype::of<double>())) return f.template operator()<double>();
  if (d.is(py::dtype::of<std::int32_t>())) return f.template operator()<std::int32_t>();
  if (d.is(py::dtype::of<std::int64_t>())) return f.template operator()<std::int64_t>();
  if (d.is(py::dtype::of<std::uint8_t>())) return f.template operator()<std::uint8_t>();
  throw Error(fmt::format("Communicator: {} has dtype {} (float32, float64, int32, int64, uint8)",
                          what, py::str(d).cast<std::string>()));
}

template <typename T>
std::span<T> span_of(const py::array& a) {
  return {static_cast<T*>(const_cast<void*>(a.data())), static_cast<std::size_t>(a.size())};
}

void same_dtype(const py::array& a, const py::array& b, const char* op) {
  if (!a.dtype().is(b.dtype())) {
    throw Error(fmt::format("Communicator.{}: send is {}, recv {}", op,
                            py::str(a.dtype()).cast<std::string>(),
                            py::str(b.dtype()).cast<std::string>()));
  }
}

}  // namespace

void init_comm_collectives(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<Communicator>>(m.attr("Communicator"));
  cls.def(
         "all_gather",
         [](const Communicator& c, const py::array& send, const py::array& recv) {
           same_dtype(send, recv, "all_gather");
           check_buffer(recv, "recv", true);
           with_dtype(send, "send", false, [&]<typename T>() {
             py::gil_scoped_release release;
             c.all_gather<T>(span_of<T>(send), span_of<T>(recv));
           });
         },
         py::arg("send"), py::arg("recv"),
         "recv (size() x len(send) elements) gets every rank's send, in rank order. In place: "
         "send is recv[:len(send)] (this rank's chunk, moved to its slot)")
      .def(
          "all_reduce",
          [](const Communicator& c, const py::array& buf, const std::string& op) {
            const ReduceOp o = reduce_op(op);
            with_dtype(buf, "buf", true, [&]<typename T>() {
              py::gil_scoped_release release;
              c.all_reduce<T>(span_of<T>(buf), o);
            });
          },
          py::arg("buf"), py::arg("op") = "sum")
      .def(
          "reduce_scatter",
          [](const Communicator& c, const py::array& send, const py::array& recv,
             const std::string& op) {
            const ReduceOp o = reduce_op(op);
            same_dtype(send, recv, "reduce_scatter");
            check_buffer(recv, "recv", true);
            with_dtype(send, "send", false, [&]<typename T>() {
              py::gil_scoped_release release;
              c.reduce_scatter<T>(span_of<T>(send), span_of<T>(recv), o);
            });
          },
          py::arg("send"), py::arg("recv"), py::arg("op") = "sum",
          "recv gets this rank's chunk (len(recv) elements) of the reduction of every send")
      .def(
          "broadcast",
          [](const Communicator& c, const py::array& buf, int root) {
            with_dtype(buf, "buf", true, [&]<typename T>() {
              py::gil_scoped_release release;
              c.broadcast<T>(span_of<T>(buf), root);
            });
          },
          py::arg("buf"), py::arg("root"))
      .def(
          "all_to_all_v",
          [](const Communicator& c, const py::array& send, const std::vector<std::size_t>& sc,
             const py::array& recv, const std::vector<std::size_t>& rc) {
            same_dtype(send, recv, "all_to_all_v");
            check_buffer(recv, "recv", true);
            with_dtype(send, "send", false, [&]<typename T>() {
              py::gil_scoped_release release;
              c.all_to_all_v<T>(span_of<T>(send), sc, span_of<T>(recv), rc);
            });
          },
          py::arg("send"), py::arg("send_counts"), py::arg("recv"), py::arg("recv_counts"),
          "Packed buffers: the chunk for (from) rank r follows those of the ranks before it");
}

}  // namespace distmuon::python
