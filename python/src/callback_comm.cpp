// A Communicator backend implemented in Python (the torch.distributed communicator). Each
// collective takes the GIL, wraps distmuon's buffers as NumPy arrays without copying, and calls
// the Python object; a Python exception becomes a distmuon::Error with its text.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>  // the all_to_all_v counts as Python lists

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "comm.h"
#include "comm/comm_names.h"
#include "distmuon/error.h"

namespace distmuon::python {
namespace {

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::kF32:
      return py::dtype::of<float>();
    case DType::kF64:
      return py::dtype::of<double>();
    case DType::kI32:
      return py::dtype::of<std::int32_t>();
    case DType::kI64:
      return py::dtype::of<std::int64_t>();
    case DType::kU8:
      return py::dtype::of<std::uint8_t>();
    case DType::kF16:
      return py::dtype("float16");
    case DType::kBf16:  // NumPy has no bf16: its bits move as float16's, never reduced
      return py::dtype("float16");
  }
  DISTMUON_ASSERT(false, "unknown dtype");
}

// Whether the chunks of n ranks lie packed: rank r's at the sum of the counts before it.
bool is_packed(const std::size_t* counts, const std::size_t* displs, std::size_t n) {
  std::size_t at = 0;
  for (std::size_t r = 0; r < n; ++r) {
    if (displs[r] != at) return false;
    at += counts[r];
  }
  return true;
}

// bf16 travels as bits (the bf16 wire moves it); adding it as float16 would be wrong.
void refuse_bf16(const char* op, DType t) {
  if (t == DType::kBf16)
    throw Error(fmt::format("a Python communicator cannot reduce bf16 values ({})", op));
}

const char* op_name(ReduceOp op) {
  return detail::name_of(op);
}

// A 1-D array of count elements over ptr; `base` (a capsule that frees nothing) marks the memory
// as borrowed, so NumPy neither copies nor frees it.
py::array borrow(const void* ptr, std::size_t count, DType t) {
  // Never destroyed (it would outlive the interpreter as a static).
  static int anchor = 0;
  static const py::capsule* base = new py::capsule(&anchor, [](void*) {});
  return py::array(numpy_dtype(t), {static_cast<py::ssize_t>(count)},
                   {static_cast<py::ssize_t>(dtype_size(t))}, ptr, *base);
}

// Per-peer counts as a Python list of ints (what torch's split sizes take). Every argument of a
// callback is a Python object made here, never a C++ container left to pybind11's optional
// casters (pybind11/stl.h): without them a std::vector is not convertible, and the call fails.
py::list counts_list(const std::size_t* counts, std::size_t n) {
  py::list out(n);
  for (std::size_t k = 0; k < n; ++k)
    out[k] = py::int_(counts[k]);
  return out;
}

class CallbackComm final : public CommImpl {
 public:
  explicit CallbackComm(py::object impl) : impl_(std::move(impl)) {
    rank_ = impl_.attr("rank")().cast<int>();
    size_ = impl_.attr("size")().cast<int>();
    // Optional: placement() -> (ranks of the group in its world, in group order; world size).
    if (py::hasattr(impl_, "placement")) {
      const py::tuple at = impl_.attr("placement")().cast<py::tuple>();
      for (const py::handle r : at[0].cast<py::list>())
        placement_.ranks.push_back(r.cast<int>());
      placement_.world_size = at[1].cast<int>();
    }
  }
  ~CallbackComm() override {
    if (!Py_IsInitialized()) {
      impl_.release();  // the interpreter is gone: nothing left to release
      return;
    }
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }
  std::string backend() const override { return "torch"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  GroupPlacement placement() const override { return placement_; }

  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    call("all_gather", [&] {
      // In place (send == recv): our chunk is moved to its slot first, as the MPI backend does.
      std::vector<char> own;
      if (send == recv) {
        own.assign(static_cast<const char*>(send),
                   static_cast<const char*>(send) + count * dtype_size(t));
        send = own.data();
      }
      impl_.attr("all_gather")(borrow(send, count, t),
                               borrow(recv, count * static_cast<std::size_t>(size_), t));
    });
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    refuse_bf16("all_reduce", t);
    call("all_reduce", [&] { impl_.attr("all_reduce")(borrow(buf, count, t), op_name(op)); });
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override {
    refuse_bf16("reduce_scatter", t);
    call("reduce_scatter", [&] {
      impl_.attr("reduce_scatter")(borrow(send, count * static_cast<std::size_t>(size_), t),
                                   borrow(recv, count, t), op_name(op));
    });
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    if (root < 0 || root >= size_) {
      throw Error(fmt::format("torch broadcast: root {} outside a group of {}", root, size_));
    }
    call("broadcast", [&] { impl_.attr("broadcast")(borrow(buf, count, t), root); });
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    call("all_to_all_v", [&] {
      const auto n = static_cast<std::size_t>(size_);
      // torch's all_to_all_single takes packed buffers: pack/unpack when the displacements leave
      // gaps (distmuon's own callers pass packed buffers, so this is the exception).
      const auto packed = [n](const std::size_t* counts, const std::size_t* displs) {
        return is_packed(counts, displs, n);
      };
      const std::size_t es = dtype_size(t);
      const std::size_t sent = std::accumulate(send_counts, send_counts + n, std::size_t{0});
      const std::size_t received = std::accumulate(recv_counts, recv_counts + n, std::size_t{0});
      std::vector<char> send_buf, recv_buf;
      const void* s = send;
      void* r = recv;
      if (!packed(send_counts, send_displs)) {
        send_buf.resize(sent * es);
        for (std::size_t k = 0, at = 0; k < n; at += send_counts[k], ++k)
          std::memcpy(send_buf.data() + at * es,
                      static_cast<const char*>(send) + send_displs[k] * es, send_counts[k] * es);
        s = send_buf.data();
      }
      const bool unpack = !packed(recv_counts, recv_displs);
      if (unpack) {
        recv_buf.resize(received * es);
        r = recv_buf.data();
      }
      impl_.attr("all_to_all_v")(borrow(s, sent, t), counts_list(send_counts, n),
                                 borrow(r, received, t), counts_list(recv_counts, n));
      if (unpack) {
        for (std::size_t k = 0, at = 0; k < n; at += recv_counts[k], ++k)
          std::memcpy(static_cast<char*>(recv) + recv_displs[k] * es, recv_buf.data() + at * es,
                      recv_counts[k] * es);
      }
    });
  }
  // Started with torch's async_op (the object's start_all_to_all_v returns a work handle) when
  // both buffers are packed; otherwise the blocking call, returned completed.
  std::unique_ptr<CommRequest> start_all_to_all_v(const void* send, const std::size_t* send_counts,
                                                  const std::size_t* send_displs, void* recv,
                                                  const std::size_t* recv_counts,
                                                  const std::size_t* recv_displs,
                                                  DType t) override {
    const auto n = static_cast<std::size_t>(size_);
    bool started = false;
    py::object work;
    if (is_packed(send_counts, send_displs, n) && is_packed(recv_counts, recv_displs, n)) {
      call("all_to_all_v", [&] {
        if (!py::hasattr(impl_, "start_all_to_all_v")) return;
        const std::size_t sent = std::accumulate(send_counts, send_counts + n, std::size_t{0});
        const std::size_t got = std::accumulate(recv_counts, recv_counts + n, std::size_t{0});
        work = impl_.attr("start_all_to_all_v")(borrow(send, sent, t), counts_list(send_counts, n),
                                                borrow(recv, got, t), counts_list(recv_counts, n));
        started = true;
      });
    }
    if (!started) {
      return CommImpl::start_all_to_all_v(send, send_counts, send_displs, recv, recv_counts,
                                          recv_displs, t);
    }
    return std::make_unique<TorchWork>(*this, std::move(work));
  }
  void barrier() override {
    call("barrier", [&] { impl_.attr("barrier")(); });
  }
  std::shared_ptr<CommImpl> split(int color, int key) override {
    std::shared_ptr<CommImpl> out;
    call("split", [&] { out = std::make_shared<CallbackComm>(impl_.attr("split")(color, key)); });
    return out;
  }
  void abort(int code) override {
    // abort() must not return, nor throw: a failing Python abort (its exception, or no
    // interpreter left) still ends in std::abort().
    try {
      if (Py_IsInitialized()) {
        py::gil_scoped_acquire gil;
        try {
          impl_.attr("abort")(code);
        } catch (py::error_already_set& e) {
          std::fprintf(stderr, "distmuon: torch.distributed abort failed on rank %d of %d: %s\n",
                       rank_, size_, e.what());
        }
      }
    } catch (...) {
      std::fprintf(stderr, "distmuon: torch.distributed abort failed on rank %d of %d\n", rank_,
                   size_);
    }
    std::abort();
  }

 private:
  template <typename F>
  void call(const char* op, F&& f) {
    py::gil_scoped_acquire gil;
    try {
      f();
    } catch (py::error_already_set& e) {
      throw Error(fmt::format("torch.distributed {} failed on rank {} of {}: {}", op, rank_, size_,
                              e.what()));
    } catch (const py::builtin_exception& e) {
      // pybind11's own failures (an argument or a result that does not convert): the same
      // context, as a distmuon::Error.
      throw Error(fmt::format("torch.distributed {} failed on rank {} of {}: {}", op, rank_, size_,
                              e.what()));
    }
  }
  // torch's work handle of a started all_to_all_v (None: already complete). The destructor waits
  // (errors ignored) when wait() was not called, so that the buffers outlive the transfer.
  class TorchWork final : public CommRequest {
   public:
    TorchWork(CallbackComm& comm, py::object work) : comm_(comm), work_(std::move(work)) {}
    void wait() override {
      comm_.call("all_to_all_v (wait)", [&] {
        py::object w = std::exchange(work_, py::none());
        if (!w.is_none()) w.attr("wait")();
      });
    }
    ~TorchWork() override {
      py::gil_scoped_acquire gil;
      try {
        if (!work_.is_none()) work_.attr("wait")();
      } catch (const std::exception&) {  // best effort: the caller is unwinding already
      }
      work_ = py::object();
    }

   private:
    CallbackComm& comm_;
    py::object work_;
  };

  py::object impl_;
  int rank_ = 0, size_ = 1;
  GroupPlacement placement_;  // not known unless the object says
};

}  // namespace

Communicator callback_communicator(py::object impl) {
  return Communicator(std::make_shared<CallbackComm>(std::move(impl)));
}

}  // namespace distmuon::python
