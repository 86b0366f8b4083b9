#include "device.h"

#include <fmt/format.h>
#include <pybind11/stl.h>

#include <map>
#include <mutex>
#include <utility>

#include "arrays.h"
#include "distmuon/error.h"

namespace distmuon::python {
namespace {

std::mutex stats_mutex;
std::map<const Compute*, TransferStats>& stats_table() {
  static auto* table = new std::map<const Compute*, TransferStats>();  // outlives the backends
  return *table;
}

void count(const Compute* c, bool upload, Index elements) {
  std::lock_guard lock(stats_mutex);
  TransferStats& s = stats_table()[c];
  const auto bytes = static_cast<std::size_t>(elements) * sizeof(float);
  if (upload) {
    ++s.uploads;
    s.upload_bytes += bytes;
  } else {
    ++s.downloads;
    s.download_bytes += bytes;
  }
}

bool is_cuda(const Compute& c) {
  return c.name().rfind("cuda:", 0) == 0;
}

// Whether c is a CUDA backend of `device`: named "cuda:N", or "cuda:N-<precision>" with an
// override (cuda_compute.cpp).
bool is_cuda_of(const Compute& c, int device) {
  const std::string prefix = fmt::format("cuda:{}", device);
  const std::string name = c.name();
  return name == prefix || name.rfind(prefix + "-", 0) == 0;
}

Backend make_backend(const std::string& name, int cuda_device, std::uintptr_t stream) {
  if (name == "cuda" && cuda_device >= 0) return {&cuda_compute_on_stream(cuda_device, stream)};
  if (name == "cuda") throw Error("backend cuda: give the CUDA device of the tensors");
  return {&compute_backend(name)};
}

py::dict memory_dict(const Backend& b) {
  const MemoryStats m = b.compute->memory_stats();
  const TransferStats t = transfer_stats(*b.compute);
  py::dict d;
  d["allocations"] = m.allocations;
  d["releases"] = m.releases;
  d["live_bytes"] = m.live_bytes;
  d["peak_bytes"] = m.peak_bytes;
  d["uploads"] = t.uploads;
  d["downloads"] = t.downloads;
  d["upload_bytes"] = t.upload_bytes;
  d["download_bytes"] = t.download_bytes;
  return d;
}

}  // namespace

TransferStats transfer_stats(const Compute& compute) {
  std::lock_guard lock(stats_mutex);
  const auto it = stats_table().find(&compute);
  return it == stats_table().end() ? TransferStats{} : it->second;
}

BackendMatrix::BackendMatrix(Backend backend, py::handle matrix, const std::string& what,
                             bool writable, DeviceMatrix* storage)
    : compute_(backend.compute),
      external_(storage),
      keep_(py::reinterpret_borrow<py::object>(matrix)) {
  Compute& c = *compute_;
  if (py::isinstance<DeviceTensor>(matrix)) {
    const auto t = matrix.cast<DeviceTensor>();
    if (!is_cuda_of(c, t.device)) {
      throw Error(fmt::format(
          "{}: a tensor on cuda:{} for the {} backend (the tensors of a call and its backend "
          "are on one device)",
          what, t.device, c.name()));
    }
    if (t.rows < 0 || t.cols < 0 || (t.rows > 1 && t.ld < t.cols)) {
      throw Error(fmt::format("{}: a CUDA tensor {} with leading dimension {}", what,
                              shape_str(t.rows, t.cols), t.ld));
    }
    caller_ = {reinterpret_cast<float*>(t.data), t.rows, t.cols, t.rows <= 1 ? t.cols : t.ld};
    return;
  }
  if (!py::isinstance<py::array>(matrix)) {
    throw Error(fmt::format("{}: expected a NumPy array or a CUDA tensor, got {}", what,
                            py::str(py::type::of(matrix).attr("__name__")).cast<std::string>()));
  }
  const auto a = py::reinterpret_borrow<py::array>(matrix);
  if (writable) {
    caller_ = mutable_view(a, what);
  } else {  // never written through: a copy's source, or an input the algorithms only read
    const ConstMatrixView v = const_view(a, what);
    caller_ = {const_cast<float*>(v.data), v.rows, v.cols, v.ld};
  }
  if (c.memory() == MemoryKind::kHost) return;
  if (is_cuda(c)) {
    throw Error(
        fmt::format("{}: host memory (a NumPy array or CPU tensor) for the {} backend: "
                    "pass CUDA tensors (tensor.cuda()) or use device \"cpu\"",
                    what, c.name()));
  }
  staged_ = true;
}

float* bf16_storage(Backend backend, py::handle matrix, const std::string& what, Index& rows,
                    Index& cols) {
  const Compute& c = *backend.compute;
  if (py::isinstance<DeviceTensor>(matrix)) {
    const auto t = matrix.cast<DeviceTensor>();
    if (!is_cuda_of(c, t.device)) {
      throw Error(
          fmt::format("{}: a tensor on cuda:{} for the {} backend", what, t.device, c.name()));
    }
    if (t.rows < 0 || t.cols < 0 || (t.rows > 1 && t.ld != t.cols)) {
      throw Error(
          fmt::format("{}: a bfloat16 CUDA tensor {} with leading dimension {} (a "
                      "bfloat16 weight is contiguous)",
                      what, shape_str(t.rows, t.cols), t.ld));
    }
    rows = t.rows;
    cols = t.cols;
    return reinterpret_cast<float*>(t.data);
  }
  if (!py::isinstance<py::array>(matrix)) {
    throw Error(fmt::format("{}: expected a NumPy array or a CUDA tensor, got {}", what,
                            py::str(py::type::of(matrix).attr("__name__")).cast<std::string>()));
  }
  const auto a = py::reinterpret_borrow<py::array>(matrix);
  if (a.itemsize() != 2 || a.ndim() != 2 || !(a.flags() & py::array::c_style) || !a.writeable()) {
    throw Error(
        fmt::format("{}: a bfloat16 weight is a writable C-contiguous 2-D array of 2-byte "
                    "elements, got {} dimension(s) of {}-byte elements",
                    what, a.ndim(), a.itemsize()));
  }
  if (c.memory() != MemoryKind::kHost) {
    throw Error(
        fmt::format("{}: host memory for the {} backend, which updates a bfloat16 weight "
                    "only in its own memory",
                    what, c.name()));
  }
  rows = static_cast<Index>(a.shape(0));
  cols = static_cast<Index>(a.shape(1));
  return static_cast<float*>(const_cast<void*>(a.data()));  // writeable, checked above
}

BackendMatrix::~BackendMatrix() {
  if (!keep_ || !Py_IsInitialized()) {
    keep_.release();
    return;
  }
  py::gil_scoped_acquire gil;
  keep_ = py::object();
}

MatrixView BackendMatrix::view() {
  if (!staged_) return caller_;
  store().ensure(*compute_, caller_.rows, caller_.cols);
  return store().view();
}

void BackendMatrix::upload() {
  upload(caller_);
}

void BackendMatrix::upload(ConstMatrixView host) {
  if (!staged_) return;
  compute_->copy_from_host(host, view());
  count(compute_, true, host.size());
}

void BackendMatrix::download() {
  if (!staged_) return;
  compute_->copy_to_host(view(), caller_);
  count(compute_, false, caller_.size());
}

void init_device(py::module_& m) {
  py::class_<DeviceTensor>(m, "DeviceTensor",
                           "A CUDA tensor's float32 memory as distmuon reads it (made by the "
                           "Python layer from a checked tensor)")
      .def(py::init([](std::uintptr_t data, Index rows, Index cols, Index ld, int device) {
             return DeviceTensor{data, rows, cols, ld, device};
           }),
           py::arg("data"), py::arg("rows"), py::arg("cols"), py::arg("ld"), py::arg("device"))
      .def_readonly("data", &DeviceTensor::data)
      .def_readonly("device", &DeviceTensor::device)
      .def_property_readonly("shape",
                             [](const DeviceTensor& t) { return py::make_tuple(t.rows, t.cols); });
  py::class_<Backend>(m, "Backend", "A compute backend of the C++ core (cpu, opaque or cuda)")
      .def_property_readonly("name", [](const Backend& b) { return b.compute->name(); })
      .def_property_readonly("host_memory", &Backend::host)
      .def("memory_stats", &memory_dict,
           "allocations, releases, live and peak bytes of the backend's memory, and the uploads "
           "and downloads (count, bytes) the Python layer made to and from it")
      .def(
          "synchronize", [](Backend& b) { b.compute->synchronize(); },
          py::call_guard<py::gil_scoped_release>());
  m.def("backend", &make_backend, py::arg("name"), py::arg("cuda_device") = -1,
        py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
  m.def("backend_names", &compute_backend_names);
  // OpenBLAS threads of this process (the Python package chooses the count: _threads.py).
  m.def("set_blas_threads", &set_blas_threads, py::arg("threads"));
  m.def("blas_threads", &blas_threads);
}

}  // namespace distmuon::python
