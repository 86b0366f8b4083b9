"""3-D DTensor parameters (a batch of matrices, e.g. the experts of a mixture-of-experts layer,
as FSDP2 shards them): this rank's local batch is one C++ parameter of that batch
(ParamSpec::batch), each slice [e] a matrix orthogonalised on its own, equal shapes in one
batched NS, as for a plain 3-D parameter (docs/python.md, "FSDP2 and DTensor parameters").

Taken: the batch whole on every rank (replicated, or a mesh of one), or split over its first
dimension by one mesh dimension (Shard(0), FSDP2's default) evenly, so that every rank holds the
same number of whole matrices and registers the same configuration. Refused, with the reason: a
split of the matrices themselves (Shard(1), Shard(2)), an uneven split of the batch, a split over
two mesh dimensions.
"""

import torch

from ._core import Error


def entry(p, user_layout, layout_cls, shard_dims, entry_cls, dtypes):
    what = "a 3-D DTensor parameter (a batch of matrices)"
    local = p._local_tensor
    if local.dtype not in dtypes or local.device.type not in ("cpu", "cuda") or \
            not local.is_contiguous():
        raise Error(f"{what}: its local tensor is {local.dtype} on {local.device}"
                    f"{'' if local.is_contiguous() else ', strided'}; distmuon updates contiguous "
                    "float32, bfloat16 and float16 tensors on the CPU or a CUDA device")
    dims = shard_dims(p, what)
    batch, m, n = p.shape
    if any(d != 0 for _, d, _ in dims) or len(dims) > 1 or any(sf for _, _, sf in dims):
        raise Error(f"{what}: placements {p.placements} split its matrices; distmuon takes a "
                    "3-D DTensor whole or split over its first dimension (Shard(0)) alone")
    if dims:
        k = p.device_mesh.size(dims[0][0])
        if batch % k != 0:
            raise Error(f"{what}: {batch} matrices split unevenly over {k} ranks; distmuon needs "
                        "every rank to hold the same number of whole matrices")
    if user_layout is not None:
        if (user_layout.rows, user_layout.cols) != (m, n):
            raise Error(f"{what}: its Layout says {user_layout.rows} x {user_layout.cols}, each "
                        f"matrix is {m} x {n}")
        if user_layout.tp_group is not None or user_layout.gtp_group is not None or \
                user_layout.tp_dim is not None or user_layout.pad:
            raise Error(f"{what}: its Layout may give only role, use_muon or name (each rank "
                        "holds whole matrices)")
        lo = user_layout
    else:
        lo = layout_cls(rows=m, cols=n)
    if local.dtype in (torch.float32, torch.bfloat16):  # bfloat16: as a plain bf16 parameter
        return entry_cls(lo, local, local, None, staged=False, flat=False, batch=True)
    # float16: float32 copies of the weights and the gradient on the tensor's device.
    work, grad_work = (torch.zeros(local.shape, device=local.device) for _ in range(2))
    return entry_cls(lo, local, work, grad_work, staged=True, flat=False, batch=True)


def stage(e, gl):
    """A staged (low-precision) batch: the weights and the gradient into float32 copies (the
    gradient as the C++ optimizer takes it: NumPy on the CPU, the tensor on a CUDA device)."""
    e.work.copy_(e.local)
    e.grad_work.copy_(gl)
    return e.grad_work if e.grad_work.device.type == "cuda" else e.grad_work.numpy()


def write_back(e):
    e.local.copy_(e.work)


def wrap_state(e, p, t):
    """A batch's state (its local matrices stacked) as a DTensor like p."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(t.reshape(e.local.shape).to(e.local.device), p.device_mesh,
                              p.placements, run_check=False, shape=p.shape, stride=p.stride())


def unwrap_state(e, s, what):
    """A loaded local state of a batch, float32 on the host, shaped like the local tensor."""
    s = s.detach().to(device="cpu", dtype=torch.float32)
    if tuple(s.shape) != tuple(e.local.shape):
        raise Error(f"{what}: local state {tuple(s.shape)}, the local weight "
                    f"{tuple(e.local.shape)}")
    return s.contiguous()
