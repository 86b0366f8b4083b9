"""Arrays and tensors as the float32 NumPy arrays the C++ core reads, without copies."""

import numpy as np


def _is_torch(x):
    mod = type(x).__module__
    return mod.startswith("torch") and hasattr(x, "data_ptr")


def as_array(x, what, allow_copy=False):
    """A NumPy view of x (ndarray, CPU torch.Tensor, or an object with __dlpack__).

    No copy is made: a tensor's storage is shared. A non-float32 or non-row-major input is
    refused (distmuon.Error from the core) unless allow_copy, where it is converted once.
    """
    if isinstance(x, np.ndarray):
        arr = x
    elif _is_torch(x):
        if x.device.type != "cpu":
            raise TypeError(f"{what}: a tensor on {x.device}; distmuon runs on CPU tensors")
        arr = x.detach().numpy()
    elif hasattr(x, "__dlpack__"):
        arr = np.from_dlpack(x)
    else:
        raise TypeError(f"{what}: expected a NumPy array or a torch.Tensor, got {type(x).__name__}")
    if allow_copy and (arr.dtype != np.float32 or not arr.flags.c_contiguous):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    return arr


_LOW_PRECISION_NAMES = ("torch.bfloat16", "torch.float16")


def is_low_precision(x):
    """A bfloat16 / float16 torch tensor (computed on through a float32 working copy)."""
    return _is_torch(x) and str(x.dtype) in _LOW_PRECISION_NAMES


def _where(x):
    """'cpu' or 'cuda:N' for an array or tensor."""
    if _is_torch(x) and x.device.type != "cpu":
        return f"{x.device.type}:{x.device.index if x.device.index is not None else 0}"
    return "cpu"


def backend_for(tensors, device, what):
    """(the C++ backend, its kind "cpu" / "opaque" / "cuda", the CUDA device index or None) of a
    call on `tensors`: device None takes the tensors' device (cpu, or cuda for CUDA tensors);
    "cpu", "opaque" (the device path on CPU tensors, staged through the opaque backend) or "cuda"
    / "cuda:N" / a torch.device must agree with the tensors. The CUDA backend runs on PyTorch's
    current stream of that device. Raises Error on mixed devices, a CUDA tensor in a build
    without CUDA, or a device the tensors are not on."""
    from ._core import Error, backend, backend_names

    places = sorted({_where(t) for t in tensors if t is not None})
    if len(places) > 1:
        raise Error(f"{what}: tensors on mixed devices ({', '.join(places)}); every tensor of a "
                    "call is on one device")
    place = places[0] if places else "cpu"
    if place != "cpu" and not place.startswith("cuda"):
        raise Error(f"{what}: a tensor on {place}; distmuon runs on CPU and CUDA tensors")
    name = "" if device is None else str(device)
    kind = name.split(":")[0] if name else ("cpu" if place == "cpu" else place.split(":")[0])
    if kind not in ("cpu", "opaque", "cuda"):
        raise Error(f"{what}: unknown device {device!r} (valid: cpu, opaque, cuda, cuda:N)")
    if place.startswith("cuda") or kind == "cuda":
        if "cuda" not in backend_names():
            raise Error(f"{what}: {'a tensor on ' + place if place != 'cpu' else 'device cuda'}, "
                        "but this build of distmuon has no CUDA backend (build it with "
                        "-DDISTMUON_ENABLE_CUDA=ON)")
    if kind in ("cpu", "opaque"):
        if place != "cpu":
            raise Error(f"{what}: device {kind!r} with a tensor on {place} (device {kind!r} takes "
                        "CPU tensors; CUDA tensors run on device \"cuda\")")
        return backend(kind), kind, None
    import torch

    if not torch.cuda.is_available():
        raise Error(f"{what}: device {name!r}, but PyTorch sees no CUDA device "
                    f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
    if place == "cpu":
        if tensors:
            raise Error(f"{what}: device {name!r} with CPU tensors (device \"cuda\" takes CUDA "
                        "tensors: move them with .cuda(), or use device \"cpu\" or \"opaque\")")
        place = name if ":" in name else f"cuda:{torch.cuda.current_device()}"
    elif ":" in name and name != place:
        raise Error(f"{what}: device {name!r} with a tensor on {place}")
    index = int(place.split(":")[1])
    stream = torch.cuda.current_stream(index).cuda_stream
    return backend("cuda", index, stream), "cuda", index


def core_matrix(t, what):
    """A 2-D float32 matrix as the C++ core takes it: a NumPy view of a host array / CPU tensor,
    or a DeviceTensor over a CUDA tensor's memory (rows in memory order, unit column stride)."""
    if not (_is_torch(t) and t.device.type == "cuda"):
        return as_array(t, what)
    from ._core import DeviceTensor, Error

    if str(t.dtype) != "torch.float32":
        raise Error(f"{what}: expected a float32 tensor, got {t.dtype}")
    if t.dim() != 2:
        raise Error(f"{what}: expected a 2-D tensor, got {t.dim()} dimension(s)")
    rows, cols = t.shape
    s0, s1 = t.stride()
    if not ((cols <= 1 or s1 == 1) and (rows <= 1 or s0 >= cols)):
        raise Error(f"{what}: a {rows}x{cols} tensor with strides ({s0}, {s1}) is not row-major "
                    "with unit column stride (make it contiguous)")
    return DeviceTensor(t.data_ptr(), rows, cols, s0 if rows > 1 else cols, t.device.index)


class cuda_ordered:
    """Context for the core's calls on CUDA device `index` (None: nothing): that device current
    (the backend's work goes to it whatever the caller's current device), and, when the backend
    runs on a stream other than PyTorch's current one (`stream`: an optimizer built under
    another stream), that stream ordered after the current one on entry and the current one
    after it on exit (stream waits, no host synchronisation)."""

    def __init__(self, index, stream=None):
        self.index, self.stream = index, stream

    def __enter__(self):
        if self.index is None:
            return self
        import torch

        self._device = torch.cuda.device(self.index)
        self._device.__enter__()
        current = torch.cuda.current_stream(self.index)
        self._wait = None
        if self.stream is not None and current.cuda_stream != self.stream:
            self._wait = (current, torch.cuda.ExternalStream(self.stream, device=self.index))
            self._wait[1].wait_stream(current)
        return self

    def __exit__(self, *exc):
        if self.index is None:
            return False
        if self._wait is not None:
            self._wait[0].wait_stream(self._wait[1])
        self._device.__exit__(*exc)
        return False
