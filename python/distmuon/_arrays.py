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
