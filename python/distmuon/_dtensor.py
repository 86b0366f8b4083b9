"""DTensor parameters (FSDP2's fully_shard, tensor parallelism with parallelize_module): their
distmuon layout, read from the device mesh and placements, and their optimizer state as DTensors
that torch.distributed.checkpoint saves and reshards (docs/python.md).

Placements -> layout (a Muon weight, full shape m x n):
  Replicate (or a mesh dimension of size 1)       not sharded over that mesh dimension; one
                                                  Replicate of a size > 1 (DDP, HSDP's replicate
                                                  dimension): dp_group, the replicas (Muon
                                                  orthogonalises the weight once over them)
  one Shard(0)                                    GTP rows over that mesh dimension's group,
                                                  pad = G * ceil(m / G) - m
  one Shard(1)                                    TP tp_dim 1, tp_pad = T * ceil(n / T) - n
  Shard(0) and Shard(1)                           GTP rows and TP tp_dim 1 (both as above)
  Shard(0) on two mesh dimensions (FSDP2 over TP  TP tp_dim 0 over the one split first (rows
  rows: _StridedShard(0) on dp, Shard(0) on tp)   even), GTP rows with pad over the other
torch cuts a dimension of size s over k ranks as torch.chunk does: rank i holds
[i c, min((i + 1) c, s)) with c = ceil(s / k), the last ranks short or empty. distmuon's shard is
c rows (or columns) with zero padding at the end: a shard whose local tensor is shorter is
staged (copied into a zero-padded tensor before the step, the update copied back after it).
The parameters that go to AdamW (1-D ones as k x 1 columns, embeddings, heads, use_muon False) are
laid out the same way: the configuration is then the same on every rank.
"""

from dataclasses import dataclass, replace
from typing import Any, Optional

import torch

from ._core import Error
from . import _dtensor_batch


# The local tensors distmuon steps: float32 in place, bfloat16 / float16 through float32 copies.
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def is_dtensor(t):
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without torch.distributed
        return False
    return isinstance(t, DTensor)


def _ceil_div(a, b):
    return -(-a // b)


@dataclass
class Entry:
    """One DTensor parameter: its local tensor, the tensor the C++ optimizer updates (`work`: the
    local tensor itself, a column view of it, or a zero-padded staging copy), the layout."""
    layout: Any  # distmuon.torch.Layout
    local: torch.Tensor
    work: torch.Tensor
    grad_work: Optional[torch.Tensor]  # staged only: the padded gradient
    staged: bool
    flat: bool  # 1-D: registered as a k x 1 column
    batch: bool = False  # 3-D: each local slice a whole matrix (_dtensor_batch.py)


def _shard_dims(p, what):
    """[(mesh dim, tensor dim, split factor or None)] of p's sharded mesh dimensions."""
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
    try:
        from torch.distributed.tensor.placement_types import _StridedShard
    except ImportError:
        _StridedShard = ()
    mesh = p.device_mesh
    out = []
    for i, pl in enumerate(p.placements):
        if isinstance(pl, Replicate) or mesh.size(i) == 1:
            continue
        if isinstance(pl, Partial):
            raise Error(f"{what}: a Partial placement on mesh dimension {i} (a parameter must be "
                        "sharded or replicated)")
        if _StridedShard and isinstance(pl, _StridedShard):
            out.append((i, pl.dim, int(pl.split_factor)))
        elif isinstance(pl, Shard):
            out.append((i, pl.dim, None))
        else:
            raise Error(f"{what}: placement {pl} on mesh dimension {i} is not supported")
    return out


def _group(mesh, i, what):
    """The process group of mesh dimension i, checked to order its ranks as the mesh does."""
    import torch.distributed as dist

    g = mesh.get_group(i)
    if dist.get_rank(g) != mesh.get_local_rank(i):
        raise Error(f"{what}: mesh dimension {i} orders its ranks unlike its process group "
                    f"(mesh coordinate {mesh.get_local_rank(i)}, group rank {dist.get_rank(g)})")
    return g


def _muon_layout(p, base, full, what):
    """base with rows, cols, tp_dim, tp_group, tp_pad, gtp_group, pad from p's placements (full:
    p's shape as a matrix)."""
    m, n = full
    mesh = p.device_mesh
    dims = _shard_dims(p, what)
    lo = replace(base, rows=m, cols=n, tp_dim=None, tp_group=None, gtp_group=None, pad=0,
                 tp_pad=0, dp_group=None)
    if any(d not in (0, 1) for _, d, _ in dims):
        raise Error(f"{what}: sharded along a dimension other than 0 or 1: {p.placements}")
    if len(dims) > 2:
        raise Error(f"{what}: sharded over {len(dims)} mesh dimensions (at most 2)")
    rows = [x for x in dims if x[1] == 0]
    cols = [x for x in dims if x[1] == 1]
    if len(cols) > 1:
        raise Error(f"{what}: columns sharded over two mesh dimensions: {p.placements}")
    if cols:
        i, _, sf = cols[0]
        if sf is not None:
            raise Error(f"{what}: a strided column shard is not supported: {p.placements}")
        t = mesh.size(i)
        lo = replace(lo, tp_dim=1, tp_group=_group(mesh, i, what), tp_pad=t * _ceil_div(n, t) - n)
    m_tp = m
    if len(rows) == 2:
        # Which split comes first: plain shards in mesh order; a _StridedShard(0, sf) is the inner
        # split of a tensor first split over sf ranks by the other mesh dimension.
        (i0, _, sf0), (i1, _, sf1) = rows
        if sf0 is None and sf1 is None:
            outer, inner = i0, i1
        elif sf0 is not None and sf1 is None and sf0 == mesh.size(i1):
            outer, inner = i1, i0
        else:
            raise Error(f"{what}: row shards {p.placements} are not supported")
        t = mesh.size(outer)
        if m % t != 0:
            raise Error(f"{what}: {m} rows split unevenly over {t} ranks and then again over "
                        f"{mesh.size(inner)}: the inner shards do not line up with distmuon's "
                        "padded ones (make the first split even)")
        lo = replace(lo, tp_dim=0, tp_group=_group(mesh, outer, what))
        m_tp = m // t
        rows = [(inner, 0, None)]
    if rows:
        i, _, sf = rows[0]
        if sf is not None:
            raise Error(f"{what}: a strided row shard is not supported: {p.placements}")
        g = mesh.size(i)
        lo = replace(lo, gtp_group=_group(mesh, i, what), pad=g * _ceil_div(m_tp, g) - m_tp)
    # The replicas: one replicated mesh dimension of more than one rank (several: each replica
    # runs its own NS, as without one).
    replicated = [i for i, pl in enumerate(p.placements)
                  if type(pl).__name__ == "Replicate" and mesh.size(i) > 1]
    lo = replace(lo, dp_group=_group(mesh, replicated[0], what) if len(replicated) == 1 else None)
    return lo


def _shard_shape(lo):
    """(rows, cols) of distmuon's padded shard of layout lo."""
    import torch.distributed as dist

    t = dist.get_world_size(lo.tp_group) if lo.tp_group is not None else 1
    g = dist.get_world_size(lo.gtp_group) if lo.gtp_group is not None else 1
    m_tp = (lo.rows + lo.tp_pad) // t if lo.tp_dim == 0 else lo.rows
    n_tp = (lo.cols + lo.tp_pad) // t if lo.tp_dim == 1 else lo.cols
    return (m_tp + lo.pad) // g, n_tp


def entry(p, user_layout, layout_cls):
    """The Entry of DTensor parameter p. user_layout (a Layout or None) may say its role,
    use_muon, qkv_split and name; its shape, if given, must be p's full shape, and the groups come
    from the placements only."""
    what = "a DTensor parameter"
    local = p._local_tensor
    if p.dim() == 3:
        return _dtensor_batch.entry(p, user_layout, layout_cls, _shard_dims, Entry, _DTYPES)
    if p.dim() not in (1, 2):
        raise Error(f"{what} is {p.dim()}-D (1-D, 2-D and 3-D DTensors only)")
    if local.dtype not in _DTYPES or local.device.type not in ("cpu", "cuda") or \
            not local.is_contiguous():
        raise Error(f"{what}: its local tensor is {local.dtype} on {local.device}"
                    f"{'' if local.is_contiguous() else ', strided'}; distmuon updates contiguous "
                    "float32, bfloat16 and float16 tensors on the CPU or a CUDA device")
    full = tuple(p.shape) if p.dim() == 2 else (p.shape[0], 1)
    if user_layout is not None:
        if (user_layout.rows, user_layout.cols) != full:
            raise Error(f"{what}: its Layout says {user_layout.rows} x {user_layout.cols}, the "
                        f"DTensor is {tuple(p.shape)}")
        if user_layout.tp_group is not None or user_layout.gtp_group is not None or \
                user_layout.tp_dim is not None or user_layout.pad:
            raise Error(f"{what}: a DTensor's groups and padding come from its placements; give "
                        "its Layout only role, use_muon, qkv_split or name")
        base = user_layout
    else:
        base = layout_cls(rows=full[0], cols=full[1], role="hidden" if p.dim() == 2 else "other")
    # Every parameter, Muon's or AdamW's, is laid out alike (a 1-D one as a k x 1 column): the
    # configuration is then the same on every rank, as the C++ optimizer requires.
    lo = _muon_layout(p, base, full, what)
    shape = _shard_shape(lo)
    local2 = local.view(-1, 1) if p.dim() == 1 else local
    if tuple(local2.shape) == shape and local.dtype in (torch.float32, torch.bfloat16):
        # Updated where it lies (a bfloat16 one through a float32 copy the C++ optimizer makes
        # for each step only, as a plain bfloat16 parameter).
        return Entry(lo, local, local2, None, staged=False, flat=p.dim() == 1)
    # Staged: a shorter shard, in a zero-padded copy (a bfloat16 one in bfloat16, updated as a
    # bfloat16 weight), or a float16 one (a float32 copy, written back rounded to the parameter's
    # dtype, as distmuon.torch steps a plain float16 parameter).
    r, c = local2.shape
    if r > shape[0] or c > shape[1]:
        raise Error(f"{what}: local tensor {tuple(local.shape)} exceeds the shard {shape} of "
                    f"placements {p.placements} (not torch.chunk's split?)")
    work_dtype = torch.bfloat16 if local.dtype == torch.bfloat16 else torch.float32
    return Entry(lo, local, torch.zeros(shape, dtype=work_dtype, device=local.device),
                 torch.zeros(shape, device=local.device), staged=True, flat=p.dim() == 1)


def stage(e):
    """Makes a bfloat16 entry's weight a float32 staged copy (device "opaque", which computes on
    its own copies only, takes a bfloat16 weight through a float32 copy)."""
    e.work = torch.zeros(e.work.shape, device=e.local.device)
    e.grad_work = torch.zeros(e.work.shape, device=e.local.device)
    e.staged = True


def array(t):
    """A matrix as the C++ optimizer takes it: NumPy for a CPU tensor, the tensor for a CUDA one."""
    return t.detach() if t.device.type == "cuda" else t.detach().numpy()


def _local2(e):
    """The local tensor as a matrix (a 1-D one as a column)."""
    return e.local.view(-1, 1) if e.flat else e.local


def check_storage(e, p):
    """Why p's local tensor is not the one registered any more ("" when it is)."""
    if p._local_tensor.data_ptr() != e.local.data_ptr() or p._local_tensor.shape != e.local.shape:
        return "was given new storage after the optimizer was built (update it in place)"
    return ""


def read_grad(e, p, finite=False):
    """(the gradient array for the C++ step, "") or (None, why). Staged entries copy the weight
    into their padded work tensor too. Rank-local, no collective."""
    g = p.grad
    if g is None:
        gl = torch.zeros_like(e.local)
    else:
        if not is_dtensor(g):
            return None, "has a plain-tensor gradient (a DTensor parameter needs a DTensor one)"
        if tuple(g.placements) != tuple(p.placements) or g.device_mesh != p.device_mesh:
            return None, (f"has a gradient with placements {g.placements}, the parameter "
                          f"{p.placements} (redistribute it first)")
        gl = g._local_tensor
    if gl.dtype != e.local.dtype or gl.device != e.local.device or not gl.is_contiguous():
        return None, (f"has a local gradient {gl.dtype} on {gl.device}"
                      f"{'' if gl.is_contiguous() else ', strided'}; expected contiguous "
                      f"{e.local.dtype} on {e.local.device} (the parameter's)")
    if gl.shape != e.local.shape:
        return None, (f"has a local gradient {tuple(gl.shape)}, the local weight "
                      f"{tuple(e.local.shape)}")
    if finite and not bool(torch.isfinite(gl).all()):
        return None, "has a non-finite gradient"
    if not e.staged:  # a bfloat16 weight's gradient: converted once per step
        return array((gl.view(-1, 1) if e.flat else gl).to(torch.float32)), ""
    if e.batch:
        return _dtensor_batch.stage(e, gl), ""
    if e.local.numel() > 0:
        r, c = _local2(e).shape
        e.work[:r, :c].copy_(_local2(e))
        e.grad_work[:r, :c].copy_(gl.view(r, c))
    return array(e.grad_work), ""


def write_back(entries):
    """After a step: the staged updates into the parameters' local tensors."""
    for e in entries:
        if e is not None and e.batch and e.staged:
            _dtensor_batch.write_back(e)
        elif e is not None and e.staged and e.local.numel() > 0:
            r, c = _local2(e).shape
            _local2(e).copy_(e.work[:r, :c])


def wrap_state(e, p, t):
    """A state tensor t (the work tensor's shape) as a DTensor with p's mesh and placements."""
    from torch.distributed.tensor import DTensor

    if e.batch:
        return _dtensor_batch.wrap_state(e, p, t)
    r, c = _local2(e).shape
    local = t[:r, :c].clone().view(e.local.shape).to(e.local.device)
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())


def unwrap_state(e, p, s, what):
    """A loaded state tensor s (a DTensor like p, as state_dict gives and DCP loads) in the work
    tensor's shape, zero-padded."""
    if is_dtensor(s):
        if tuple(s.placements) != tuple(p.placements) or s.shape != p.shape:
            raise Error(f"{what}: a DTensor {tuple(s.shape)} with placements {s.placements}, the "
                        f"parameter {tuple(p.shape)} with {p.placements} (load it through "
                        "torch.distributed.checkpoint into this optimizer's state_dict())")
        s = s._local_tensor
    if e.batch:
        return _dtensor_batch.unwrap_state(e, s, what)
    s = s.detach().to(torch.float32)
    if s.numel() != e.local.numel() or (not e.flat and tuple(s.shape) != tuple(e.local.shape)):
        raise Error(f"{what}: local state {tuple(s.shape)}, the local weight "
                    f"{tuple(e.local.shape)}")
    out = torch.zeros(e.work.shape, dtype=torch.float32)
    r, c = _local2(e).shape
    if s.numel() > 0:
        out[:r, :c].copy_(s.reshape(r, c))
    return out
