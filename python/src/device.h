#pragma once
// Where the Python layer's work runs (a backend) and how a Python matrix becomes that backend's
// memory. A matrix is a float32 NumPy array (host memory) or a DeviceTensor (the memory of a CUDA
// tensor, described by the Python layer: its address, shape, leading dimension and device).
// A backend that can address the matrix computes on it where it lies (cpu on host arrays, cuda
// on CUDA tensors); any other device backend (opaque on host arrays) gets a copy in its own
// memory, uploaded and downloaded around the work. Both paths run the same code below but for
// that difference, so that the opaque backend on CPU tensors exercises the device path in CI.
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "distmuon/compute.h"

namespace distmuon::python {

namespace py = pybind11;

// A CUDA tensor's float32 memory: rows x cols, leading dimension ld (elements), on CUDA device
// `device`. The Python layer checks dtype, device and strides with torch before making one and
// keeps the tensor alive while it is used.
struct DeviceTensor {
  std::uintptr_t data = 0;
  Index rows = 0, cols = 0, ld = 0;
  int device = 0;
};

// Transfers the Python layer made between host matrices and a backend's memory, per backend.
struct TransferStats {
  std::size_t uploads = 0, downloads = 0;
  std::size_t upload_bytes = 0, download_bytes = 0;
};

// A backend chosen by the Python layer: "cpu", "opaque", or "cuda" with (device, stream), the
// stream a cudaStream_t as an integer (PyTorch's current stream).
struct Backend {
  Compute* compute = nullptr;
  bool host() const { return compute->memory() == MemoryKind::kHost; }
};

// One matrix of the caller's as backend memory: a view of it where the backend addresses it,
// else a copy in the backend's memory (kept: its shape is fixed) that upload() fills from the
// caller's matrix and download() writes back. Throws distmuon::Error naming `what` on a matrix the
// backend cannot take (a CUDA tensor for a backend that is not CUDA on its device, a NumPy array
// that is not float32 row-major, a read-only array where writable).
class BackendMatrix {
 public:
  // storage: where a staged copy lives (a buffer the caller keeps across calls, reallocated only
  // when its shape differs); none: a buffer of this object's own. The copy is allocated at the
  // first view() or upload().
  BackendMatrix(Backend backend, py::handle matrix, const std::string& what, bool writable,
                DeviceMatrix* storage = nullptr);
  BackendMatrix(BackendMatrix&&) noexcept = default;
  BackendMatrix& operator=(BackendMatrix&&) noexcept = default;
  BackendMatrix(const BackendMatrix&) = delete;
  BackendMatrix& operator=(const BackendMatrix&) = delete;
  ~BackendMatrix();  // releases the object's reference (taking the GIL)

  // The matrix in the backend's memory (the staged copy, allocated on first use, or the view).
  MatrixView view();
  bool staged() const { return staged_; }
  // The caller's matrix: host memory when staged.
  MatrixView caller() const { return caller_; }
  // Host -> backend (from the caller's matrix, or from `host`) and backend -> host, for a staged
  // matrix; no-ops for a view. Counted in transfer_stats().
  void upload();
  void upload(ConstMatrixView host);
  void download();

 private:
  DeviceMatrix& store() { return external_ != nullptr ? *external_ : copy_; }

  Compute* compute_ = nullptr;
  MatrixView caller_{};  // the caller's matrix (its own memory)
  bool staged_ = false;  // caller_ is host memory of a device backend
  DeviceMatrix copy_;    // staged, without external storage: the backend's copy
  DeviceMatrix* external_ = nullptr;
  py::object keep_;  // the caller's object, alive as long as this
};

// A bfloat16 matrix's memory as `backend` addresses it, for ParamSpec::bf16: a C-contiguous 2-D
// NumPy array of 2-byte elements (a CPU bfloat16 tensor viewed as int16) on a host backend, or a
// DeviceTensor over a contiguous CUDA bfloat16 tensor on the CUDA backend of its device. Sets
// rows and cols; throws distmuon::Error naming `what` on anything else (the opaque backend,
// which addresses no caller memory, included).
float* bf16_storage(Backend backend, py::handle matrix, const std::string& what, Index& rows,
                    Index& cols);

TransferStats transfer_stats(const Compute& compute);

void init_device(py::module_& m);

}  // namespace distmuon::python
