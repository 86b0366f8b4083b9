"""distmuon.torch.Muon: a drop-in for torch.optim.Muon, over CPU parameters that may be shards.

The arguments torch.optim.Muon has (lr, weight_decay, momentum, nesterov, ns_coefficients, eps,
ns_steps, adjust_lr_fn) have its names, defaults and meaning; the parameters torch.optim.Muon
refuses go to distmuon's AdamW (1-D and 0-D parameters, and those of a group with
use_muon=False or whose Layout says so) or are orthogonalised as torch leaves it to users to do
(3-D: a batch of matrices, one C++ parameter whose slices are each orthogonalised on their own,
equal shapes in one batched NS; 4-D and more: flattened to out x rest).
docs/python.md has the table of defaults next to torch's.

Each parameter may be this rank's shard of a larger weight. Its layout comes from, in order: the
param group's "layouts" list (one Layout per parameter, None for the default), the parameter's
`distmuon_layout` attribute, or the default (a whole matrix on this rank). The C++ optimizer
updates float32 parameters in place; bfloat16 / float16 ones through a float32 copy made at each
step (the state stays float32, the update is written back in the parameter's dtype).

Every key of _GROUP_KEYS is read at every step (schedulers may change any of them). Other
options (tp_mode, ns_algorithm, profile, ...) are fixed at construction.
"""

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import numpy as np
import torch

from . import Communicator, Error, Muon as _CoreMuon, communicator, _precision_name
from ._arrays import core_matrix, cuda_ordered
from . import _dtensor
from . import process_groups  # noqa: F401  (distmuon.torch.process_groups: the same helper)
from ._torch_state import build_state_dict, load_group_state, check_state_dict
from . import _threads, _torch_live
from ._log import drain as _drain_log
from ._types import describe_exception

# torch.optim.Muon's defaults (torch/optim/_muon.py, torch 2.13).
TORCH_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
_TORCH_DEFAULTS = dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                       ns_coefficients=TORCH_NS_COEFFICIENTS, eps=1e-7, ns_steps=5,
                       adjust_lr_fn=None)
# distmuon's AdamW, for the parameters Muon does not orthogonalise.
_ADAMW_DEFAULTS = dict(adamw_lr=1e-3, adamw_weight_decay=0.0, adamw_betas=(0.9, 0.95),
                       adamw_eps=1e-8)
# Read at every step; round-tripped by state_dict / load_state_dict (initial_lr too).
_GROUP_KEYS = tuple(_TORCH_DEFAULTS) + tuple(_ADAMW_DEFAULTS) + ("extra_scale_factor",)
# adjust_lr_fn -> (C++ scale_mode, factor): torch's two and distmuon's three scale modes.
_ADJUST_LR = {None: ("shape_scaling", 1.0), "original": ("shape_scaling", 1.0),
              "match_rms_adamw": ("spectral", 0.2), "spectral": ("spectral", 1.0),
              "shape_scaling": ("shape_scaling", 1.0), "unit_rms_norm": ("unit_rms_norm", 1.0)}
_LOW_PRECISION = (torch.bfloat16, torch.float16)


@dataclass
class Layout:
    """How this rank's parameter (the shard) sits in the full weight (docs/optimizer.md).

    rows x cols: the full, unpadded weight (of each matrix of a 3-D batch). tp_dim 0/1: split
    over tp_group (a distmuon.Communicator, a torch process group, or "world": the optimizer's
    process group). gtp_group: the TP-local tensor, padded with `pad` zero rows, split by rows
    over it. tp_pad: zero rows/columns extending the full weight along tp_dim (uneven TP
    shards). qkv_split: rows per query group of each block type. role: hidden (Muon),
    embedding, output_head or other (AdamW); use_muon False sends a hidden matrix to AdamW too.
    dp_group: the ranks holding the same shard (data-parallel replicas): Muon orthogonalises
    the weight once, on one home rank of them (replica_mode; docs/data-parallel.md).
    A DTensor parameter needs none: its layout comes from its mesh and placements (_dtensor.py).
    """
    rows: int
    cols: int
    tp_dim: Optional[int] = None
    tp_group: Any = None
    gtp_group: Any = None
    pad: int = 0
    qkv_split: Sequence[int] = ()
    role: str = "hidden"
    use_muon: bool = True
    expert: bool = False
    expert_rank: int = 0
    name: Optional[str] = None
    tp_pad: int = 0
    dp_group: Any = None


class _Param:
    """One torch parameter as the C++ optimizer sees it: its float32 matrix (a 3-D parameter's
    batch stacked by rows: one C++ parameter of that batch), its layout, and its index in the
    group's core."""

    def __init__(self, p, layout, matrix, work, dt=None):
        self.p = p
        self.layout = layout
        self.matrix = matrix  # the 2-D view (NumPy, or a tensor: CUDA, bfloat16) the C++ updates
        self.work = work      # float32 copy of a low-precision parameter, else None
        self.dt = dt          # a DTensor parameter's _dtensor.Entry, else None
        self.address = p.data_ptr() if dt is None else dt.local.data_ptr()
        # Its C++ parameter's index in the group's core; None for a 3-D parameter of no matrices
        # (a batch of 0 holds nothing to update and is not registered).
        self.index: Optional[int] = None
        self.muon = False
        # Matrices in the C++ parameter: a 3-D parameter's (its local) batch, else 1.
        local = p if dt is None else dt.local
        self.batch = local.shape[0] if local.dim() == 3 else 1

    @property
    def logical_shape(self):
        """The shape of the parameter's state as state_dict shows it (the parameter's)."""
        return tuple(self.p.shape)


def _default_layout(p, use_muon):
    if p.dim() <= 1:
        return Layout(rows=max(p.numel(), 0), cols=1, role="other")
    m = _matrix_shape(p)
    return Layout(rows=m[0], cols=m[1], use_muon=use_muon)


def _matrix_shape(p):
    """Rows x cols of each matrix: 2-D as is; 3-D a batch of shape[1:] matrices; more
    dimensions flattened to shape[0] x rest (conv weights, as Keller Jordan's Muon)."""
    if p.dim() == 3:
        return p.shape[1], p.shape[2]
    if p.dim() >= 4:
        return p.shape[0], math.prod(p.shape[1:])
    return tuple(p.shape) if p.dim() == 2 else (max(p.numel(), 0), 1)


def _as_matrix(t):
    """The 2-D view of a contiguous float32 tensor t the C++ optimizer takes (NumPy for a CPU
    tensor, the tensor's own for a CUDA one; a bfloat16 one stays a tensor, which
    distmuon.Muon.add_parameter takes as a bfloat16 weight): a 3-D batch [E, m, n] stacked by
    rows, (E m) x n (one batched parameter)."""
    a = t.detach() if t.device.type == "cuda" or t.dtype == torch.bfloat16 else \
        t.detach().numpy()
    if t.dim() == 3:
        return a.reshape(-1, a.shape[-1])
    if t.dim() >= 4:
        return a.reshape(a.shape[0], -1)
    return a.reshape(-1, 1) if t.dim() <= 1 else a


def _on_meta(p):
    return (p._local_tensor if _dtensor.is_dtensor(p) else p).device.type == "meta"


def _check_layout(layout):
    """Rank-local: raises Error unless layout is a Layout whose groups can become communicators
    (checked before the agreement: making them is collective)."""
    if not isinstance(layout, Layout):
        raise Error(f"its layout is a {type(layout).__name__} ({layout!r:.40}), not a "
                    "distmuon.torch.Layout")
    for key in ("tp_group", "gtp_group"):
        g = getattr(layout, key)
        mod = type(g).__module__
        named = isinstance(g, str) and g in ("world", "torch")
        if not (g is None or named or isinstance(g, Communicator) or mod.startswith("mpi4py") or
                mod.startswith("torch")):
            raise Error(f"its Layout's {key} is a {type(g).__name__} ({g!r:.40}); expected None, "
                        "\"world\", a distmuon.Communicator, an mpi4py communicator or a torch "
                        "process group")


def _to_local(p, layout):
    """(1) A parameter as the C++ optimizer takes it: its float32 matrix and layout.
    Rank-local checks; raises Error on a parameter distmuon cannot update."""
    if layout is not None:
        _check_layout(layout)
    if _dtensor.is_dtensor(p):  # FSDP2 / TP: layout and updated tensor from the placements
        dt = _dtensor.entry(p, layout, Layout)
        return _Param(p, dt.layout, _as_matrix(dt.work), None, dt)
    if p.device.type == "meta":
        raise Error("a parameter still on the meta device at the first step (materialise it in "
                    "place first: torch.__future__.set_swap_module_params_on_conversion(True) "
                    "before model.to_empty(device=...) keeps the parameters the optimizer holds)")
    if p.device.type not in ("cpu", "cuda"):
        raise Error(f"a parameter on {p.device}; distmuon.torch runs on CPU and CUDA parameters")
    if p.dtype == torch.float32 and p.is_contiguous():
        return _Param(p, layout, _as_matrix(p.data), None)
    if p.dtype == torch.bfloat16 and p.is_contiguous():
        # Updated where it lies: the C++ optimizer unpacks it into a float32 copy for each step
        # only (device "opaque", which computes on its own copies, gets a working copy instead:
        # _working_copies).
        return _Param(p, layout, _as_matrix(p.data), None)
    # Low precision or strided (a transposed or channels_last parameter): a contiguous float32
    # working copy, on the parameter's device, copied in before and back after each step.
    if p.dtype in _LOW_PRECISION or p.dtype == torch.float32:
        work = torch.empty(p.shape, dtype=torch.float32, device=p.device)
        return _Param(p, layout, _as_matrix(work), work)
    raise Error(f"a parameter of {p.dtype}; distmuon.torch updates float32, bfloat16 and "
                "float16 parameters")


def _working_copies(entries):
    """Device "opaque": its bfloat16 parameters stepped through float32 working copies."""
    for e in entries:
        if e.dt is not None and e.dt.work.dtype == torch.bfloat16:
            _dtensor.stage(e.dt)
            e.matrix = _as_matrix(e.dt.work)
        elif e.dt is None and e.work is None and e.p.dtype == torch.bfloat16:
            e.work = torch.empty(e.p.shape, dtype=torch.float32, device=e.p.device)
            e.matrix = _as_matrix(e.work)


def _read_grad(entry):
    """(2) This rank's gradient of a parameter as a float32 matrix shaped like its own (None:
    no gradient). Raises Error, completing "the gradient ... is", on one that cannot be."""
    p, g = entry.p, entry.p.grad
    if g is None:
        return None
    if entry.dt is not None:  # DTensor: its local gradient (staged when padded)
        a, why = _dtensor.read_grad(entry.dt, p)
        if why:
            raise Error(why)
        return a.reshape(-1, a.shape[-1]) if a.ndim == 3 else a  # a batch: stacked
    if g.dtype is torch.float32 and p.dtype is torch.float32 and g.layout is torch.strided and \
            g.device == p.device and g.shape == p.shape and g.is_contiguous():
        return _as_matrix(g)  # the common case: read where it lies
    if g.shape != p.shape:
        raise Error(f"{tuple(g.shape)}, the parameter {tuple(p.shape)}")
    if g.device != p.device or g.is_sparse or g.dtype != p.dtype:
        raise Error(f"{g.dtype}{' sparse' if g.is_sparse else ''} on {g.device}; expected a "
                    f"dense tensor of the parameter's dtype ({p.dtype}) on its device "
                    f"({p.device})")
    if g.dtype != torch.float32 or not g.is_contiguous():
        g = g.to(torch.float32).contiguous()  # low precision or strided: one converted copy
    return _as_matrix(g)


def _first_nonfinite(checks):
    """The first of `checks` ((name, matrices) pairs) whose matrices hold a non-finite value, or
    None. NumPy matrices are read on the host; the CUDA tensors of all of them are reduced on
    their devices and read back in one transfer per device: one host synchronisation per step,
    not one per gradient."""
    flags = [None] * len(checks)
    on_device = {}  # device -> [(check index, per-matrix all-finite flag tensor)]
    for i, (_, mats) in enumerate(checks):
        for m in mats:
            if isinstance(m, torch.Tensor):
                on_device.setdefault(m.device, []).append((i, torch.isfinite(m).all()))
            elif not np.isfinite(m).all():
                flags[i] = False
    for pairs in on_device.values():
        read = torch.stack([f for _, f in pairs]).tolist()  # the one host read of this device
        for (i, _), ok in zip(pairs, read):
            if not ok:
                flags[i] = False
    return next((name for (name, _), ok in zip(checks, flags) if ok is False), None)


def _group_device(entries, device, gi):
    """The device of a param group's core: `device` (the optimizer's, None: from the
    parameters) against its parameters' devices; raises Error on a mix."""
    places = sorted({str(e.p.device if e.dt is None else e.dt.local.device) for e in entries})
    if len(places) > 1:
        raise Error(f"parameters on mixed devices ({', '.join(places)}); every parameter of a "
                    "param group is on one device")
    place = places[0] if places else "cpu"
    if device is None:
        return "cpu" if place == "cpu" else place
    name = str(device)
    if name in ("cpu", "opaque"):
        if place != "cpu":
            raise Error(f"device {name!r} with parameters on {place} (device {name!r} takes CPU "
                        "parameters)")
        return name
    if name.split(":")[0] == "cuda":
        if place == "cpu" and entries:
            raise Error(f"device {name!r} with CPU parameters (move the model with .cuda())")
        if ":" in name and place != "cpu" and name != place:
            raise Error(f"device {name!r} with parameters on {place}")
        return place if place != "cpu" else name
    raise Error(f"unknown device {device!r} (valid: cpu, opaque, cuda, cuda:N)")


def _coefficients(value):
    """ns_coefficients as C++ options: one (a, b, c) tuple used at every step (torch's), a
    list of tuples (a schedule, cycled) or the name of a built-in set."""
    if isinstance(value, str):
        return {"coefficients": value, "custom_coefficients": ""}
    seq = list(value)
    table = [seq] if len(seq) == 3 and all(isinstance(v, (int, float)) for v in seq) else seq
    rows = []
    for t in table:
        t = [float(v) for v in t]
        if len(t) != 3:
            raise ValueError(f"ns_coefficients: {value!r} is not (a, b, c), a list of them or a "
                             "coefficient set name")
        rows.append(",".join(repr(v) for v in t))
    return {"coefficients": "custom", "custom_coefficients": ";".join(rows)}


def _adamw_factor(group):
    """The schedule's factor for AdamW: lr / initial_lr (1 when initial_lr is 0 and lr is not;
    0 when lr is 0, which freezes the group)."""
    lr, initial = float(group["lr"]), float(group.get("initial_lr", group["lr"]))
    if lr == 0.0:
        return 0.0
    return lr / initial if initial > 0 else 1.0


def _group_key(group):
    """The values of a group's per-step keys, compared at each step to skip rebuilding its
    options when no schedule changed them (containers by their text: changed in place too)."""
    return tuple(v if isinstance(v, (int, float, str, type(None))) else repr(v)
                 for v in (group.get(k) for k in _GROUP_KEYS + ("initial_lr",)))


def group_options(group):
    """The C++ options (MuonOptions' JSON names) of a param group's per-step keys. Raises
    ValueError / TypeError on a value that cannot be one."""
    fn = group["adjust_lr_fn"]
    if fn not in _ADJUST_LR:
        raise ValueError(f"adjust_lr_fn {fn!r} is not supported (valid: None, "
                         + ", ".join(repr(k) for k in _ADJUST_LR if k) + ")")
    scale_mode, factor = _ADJUST_LR[fn]
    beta1, beta2 = (float(b) for b in group["adamw_betas"])
    return dict(lr=float(group["lr"]), weight_decay=float(group["weight_decay"]),
                momentum=float(group["momentum"]), nesterov=bool(group["nesterov"]),
                eps=float(group["eps"]), steps=int(group["ns_steps"]), scale_mode=scale_mode,
                extra_scale_factor=factor * float(group["extra_scale_factor"]),
                **_coefficients(group["ns_coefficients"]),
                adamw=dict(lr=float(group["adamw_lr"]) * _adamw_factor(group),
                           weight_decay=float(group["adamw_weight_decay"]), beta1=beta1,
                           beta2=beta2, eps=float(group["adamw_eps"])))


class Muon(torch.optim.Optimizer):
    """torch.optim.Muon's arguments and defaults, on sharded CPU parameters; AdamW for the rest.

    process_group: None (torch's default group when torch.distributed is initialised, else one
    process), a torch.distributed group, "torch" or a distmuon.Communicator / mpi4py
    communicator: the world of step() and the checkpoints. tp_mode "auto" (default) plans
    duplicated / distributed / owner per weight from the cost model. Other keyword options are
    distmuon.Muon's fixed ones (MuonOptions' JSON names: ns_algorithm, gram_restart, use_syrk,
    precision, cost_model, profile, plan, wisdom, weight_decay_method, extra_scale_factor,
    step_timeout_s, momentum_dtype: "param" keeps a bfloat16 parameter's momentum in bfloat16,
    as torch.optim.Muon does).
    precision: "fp32", "tf32", "bf16" or None (the backend's default: fp32 on the CPU).
    """

    def __init__(self, params, lr=_TORCH_DEFAULTS["lr"],
                 weight_decay=_TORCH_DEFAULTS["weight_decay"],
                 momentum=_TORCH_DEFAULTS["momentum"], nesterov=_TORCH_DEFAULTS["nesterov"],
                 ns_coefficients=TORCH_NS_COEFFICIENTS, eps=_TORCH_DEFAULTS["eps"],
                 ns_steps=_TORCH_DEFAULTS["ns_steps"], adjust_lr_fn=None, *,
                 adamw_lr=1e-3, adamw_weight_decay=0.0, adamw_betas=(0.9, 0.95),
                 adamw_eps=1e-8, process_group=None, tp_mode="auto", device=None, **options):
        # The arguments as given: deepcopy and pickle build the copy from them (_torch_live).
        self._init_kwargs = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
            ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn, adamw_lr=adamw_lr, adamw_weight_decay=adamw_weight_decay,
            adamw_betas=adamw_betas, adamw_eps=adamw_eps, process_group=process_group,
            tp_mode=tp_mode, device=device, **options)
        if isinstance(lr, torch.Tensor):
            if lr.numel() != 1:
                raise ValueError("Tensor lr must be 1-element")
            lr = float(lr)
        for name, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"{name} must be a number, got {type(v).__name__} {v!r:.40}")
            if not 0.0 <= v:
                raise ValueError(f"{name} should be >= 0 but is: {v}")
        if adjust_lr_fn not in _ADJUST_LR:
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        # Where torch's maths diverges, refused with the reason (docs/python.md).
        if momentum > 1:
            raise ValueError(f"momentum should be <= 1 but is: {momentum} (above 1 the momentum "
                             "buffer grows geometrically at every step)")
        if not eps > 0:
            raise ValueError(f"eps should be > 0 but is: {eps} (with eps 0 a zero update is "
                             "divided by zero)")
        if "coefficients" in options:  # distmuon's name for a built-in set
            if ns_coefficients is not TORCH_NS_COEFFICIENTS:
                raise ValueError("give ns_coefficients or coefficients, not both")
            ns_coefficients = options.pop("coefficients")
        for moved in ("lr", "momentum", "nesterov", "steps", "custom_coefficients", "scale_mode",
                      "adamw"):
            if moved in options:
                raise ValueError(f"distmuon.torch.Muon: '{moved}' is a C++ option name; use "
                                 "the torch ones (lr, momentum, nesterov, ns_steps, "
                                 "ns_coefficients, adjust_lr_fn, adamw_*)")
        if "precision" in options:  # checked here, not at the first step
            options["precision"] = _precision_name(options["precision"], "distmuon.torch.Muon")
        if process_group is None and torch.distributed.is_available() and \
                torch.distributed.is_initialized():
            process_group = "torch"
        self._world = communicator(process_group)
        self._group_comms = {} if process_group is None else {
            id(process_group): (process_group, self._world)}
        # torch.optim.Muon runs any schedule: refuse only one that reverses, diverges or blows up
        # a direction, warn once about one that merely ends outside its band (docs/python.md).
        options.setdefault("schedule_check", "warn")
        # Plain (non-DTensor) parameters without a layout of their own are replicated over it.
        self._data_parallel_group = options.pop("data_parallel_group", None)
        self._options = dict(options, tp_mode=tp_mode)
        self._device = device
        self._cores = []   # per param group: (core, [_Param])
        self._pushed = []  # per param group: the options last given to its core (JSON text)
        self._pushed_keys = []  # per param group: _group_key of the group when last pushed
        self._steps = []  # per param group: the "step" tensors of its parameters' state
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, adamw_lr=adamw_lr,
                        adamw_weight_decay=adamw_weight_decay, adamw_betas=adamw_betas,
                        adamw_eps=adamw_eps, use_muon=True,
                        extra_scale_factor=options.pop("extra_scale_factor", 1.0))
        try:
            super().__init__(params, defaults)
        finally:
            _drain_log(self._world.rank)

    @property
    def world(self):
        return self._world

    def _group_comm(self, g):
        """The Communicator of a layout's group, made once per group object (weights sharing a
        group share its communicator: owner mode buckets them by it)."""
        if g is None or isinstance(g, Communicator):
            return g
        if isinstance(g, str) and g == "world":
            return self._world
        if id(g) not in self._group_comms:
            self._group_comms[id(g)] = (g, communicator(g))
        return self._group_comms[id(g)][1]

    def add_param_group(self, param_group):
        # Collective over the process group: a group refused on one rank is refused on every
        # rank (agreed), and the optimizer is left without it everywhere.
        if isinstance(param_group, dict) and "params" not in param_group:
            raise ValueError(f"a param group needs 'params' (its parameters); it has "
                             f"{', '.join(map(repr, param_group)) or 'no key'}")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.setdefault("initial_lr", group["lr"])  # AdamW's schedule factor (see _adamw_factor)
        gi = len(self.param_groups) - 1
        try:
            self._agree_on_structure(f"add param group {gi} of {len(group['params'])} parameters")
            self._add_group(group, gi)
        except BaseException:
            self.param_groups.pop()
            raise

    def _add_group(self, group, gi):
        """A group's C++ optimizer, or a placeholder when its parameters are on the meta device
        (every rank alike, agreed): its C++ optimizer and state are made at the first step, as
        torch.optim.Muon makes its state then (_materialize)."""
        deferred = any(_on_meta(p) for p in group["params"])
        n = self._world.all_reduce_sum(float(deferred)) if self._world.size > 1 else \
            float(deferred)
        if 0 < n < self._world.size:
            raise Error(f"distmuon.torch.Muon: param group {gi} has meta-device parameters on "
                        f"{int(n)} of {self._world.size} ranks (every rank or none)")
        if deferred:
            self._install(gi, None, [], {})
        else:
            self._install(gi, *self._add_core(group, gi))

    def _install(self, gi, core, entries, opts):
        """Keeps a group's C++ optimizer at index gi (a new group, or a deferred one made) and
        puts its parameters' state into self.state."""
        parts = ((core, entries), json.dumps(opts, sort_keys=True), None,
                 _torch_live.attach(self.state, entries, core) if core is not None else [])
        for store, value in zip((self._cores, self._pushed, self._pushed_keys, self._steps),
                                parts):
            if gi == len(store):
                store.append(value)
            else:
                store[gi] = value

    def _materialize(self):
        """Makes the C++ optimizers of the groups deferred at construction (collective)."""
        for gi, (group, (core, _)) in enumerate(zip(self.param_groups, self._cores)):
            if core is None:
                self._install(gi, *self._add_core(group, gi))

    def _agree_on_structure(self, operation):
        """Collective, first in every operation that runs collectives: the ranks agree on the
        operation and on the param groups they hold (how many, how many parameters each), so
        that a rank that added a group the others did not (or runs another operation) raises
        CollectiveError on every rank instead of leaving them in different collectives."""
        groups = ",".join(str(len(entries)) for _, entries in self._cores)
        self._world.agree_on(f"{operation}; param groups of [{groups}] parameters",
                             "distmuon.torch.Muon: the ranks' operation and param groups")

    def _add_core(self, group, gi):
        """(core, entries, options) of a param group: checked on this rank, agreed, then
        registered with the C++ optimizer (the C++ checks agreed too). Collective."""
        what = f"distmuon.torch.Muon: param group {gi}"
        # This rank's checks first, agreed before anything collective (an mpi4py group's
        # communicator is made by MPI_Comm_dup on every rank).
        failure, entries, opts = "", [], {}
        try:
            opts = group_options(group)
            layouts = group.get("layouts") or [None] * len(group["params"])
            if len(layouts) != len(group["params"]):
                raise Error(f"{len(layouts)} layouts for {len(group['params'])} parameters")
            for k, (p, layout) in enumerate(zip(group["params"], layouts)):
                layout = layout or getattr(p, "distmuon_layout", None)
                if layout is None and not _dtensor.is_dtensor(p):
                    layout = _default_layout(p, bool(group["use_muon"]))
                    if self._data_parallel_group is not None and layout.role == "hidden":
                        layout = replace(layout, dp_group=self._data_parallel_group)
                try:
                    entries.append(_to_local(p, layout))
                except Error as e:
                    raise Error(f"parameter {k}: {e}") from None
            device = _group_device(entries, self._device, gi)
            if device == "opaque":
                _working_copies(entries)
        except Exception as e:  # any refusal, whatever its type: agreed below
            failure = describe_exception(e)
        self._world.agree_or_throw(not failure, what, failure)
        groups = [(self._group_comm(e.layout.tp_group), self._group_comm(e.layout.gtp_group),
                   self._group_comm(e.layout.dp_group)) for e in entries]
        # Then the C++ checks of each shard against its layout (rank-local), agreed.
        core = None
        try:
            core = _CoreMuon(self._world, device=device, **dict(self._options, **opts))
            for k, (e, (tp, gtp, dp)) in enumerate(zip(entries, groups)):
                lo = e.layout
                base = lo.name or f"group{gi}.param{k}"
                if e.batch > 0:  # a 3-D one: one batch
                    e.index = core.add_parameter(
                        e.matrix, base, lo.rows, lo.cols, role=lo.role,
                        use_muon=lo.use_muon and bool(group["use_muon"]), tp_dim=lo.tp_dim,
                        tp_group=tp, gtp_group=gtp, pad=lo.pad, expert=lo.expert,
                        expert_rank=lo.expert_rank, qkv_split=lo.qkv_split, tp_pad=lo.tp_pad,
                        data_parallel_group=dp, batch=e.batch)
            infos = core.parameters()
            for e in entries:
                e.muon = e.index is not None and bool(infos[e.index]["muon"])
        except Exception as e:
            failure = describe_exception(e)
        self._world.agree_or_throw(not failure, what, failure)
        return core, entries, opts

    def _check_group(self, gi, group, core, entries, finite):
        """This rank's gradients of param group gi (None where a parameter has none) and active
        flags, or the reason it cannot step (rank-local). finite: None, or a list to which each
        gradient's (reason, matrices) is appended, checked for non-finite values by the caller
        (_first_nonfinite: one host read per step; group 0's C++ step checks its own)."""
        grads, active = [], []
        for k, e in enumerate(entries):
            if e.dt is not None:  # DTensor: its local tensor is the one registered
                moved = _dtensor.check_storage(e.dt, e.p)
            else:
                moved = "" if e.p.data_ptr() == e.address else \
                    "was given new storage after the optimizer was built (update it in place)"
            if moved:
                return None, None, f"parameter {k} of group {gi} {moved}"
            try:
                grad = _read_grad(e)
            except Error as err:
                return None, None, (f"DTensor parameter {k} of group {gi} {err}" if e.dt else
                                    f"the gradient of parameter {k} of group {gi} is {err}")
            if grad is not None and finite is not None:
                finite.append((f"the gradient of parameter {k} of group {gi} has a non-finite "
                               "value", [grad]))
            if e.index is not None:  # one per C++ parameter, in their order
                grads.append(grad)
                active.append(0 if grad is None else 1)
        try:
            key = _group_key(group)  # cheap; the options are rebuilt only when a key changed
            if key != self._pushed_keys[gi]:
                opts = json.dumps(group_options(group), sort_keys=True)
                if opts != self._pushed[gi]:  # rank-local; the step agrees the options
                    core._core.set_options(opts)
                    self._pushed[gi] = opts
                self._pushed_keys[gi] = key
        except Exception as err:
            return None, None, f"group {gi}: {describe_exception(err)}"
        return grads, active, ""

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every param group. Collective over the process group: every check of
        every group (storage, gradients, hyper-parameters) is agreed on by all ranks, inside the
        first group's C++ step and before any update, so that a refusal on one rank raises
        distmuon.CollectiveError on every rank and no group has stepped. Each group's C++ step
        also agrees its options and which parameters have a gradient (docs/python.md)."""
        try:
            return self._step(closure)
        finally:
            _drain_log(self._world.rank)

    def _step(self, closure):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._agree_on_structure("step")
        self._materialize()
        checked, failure, later = [], "", []  # later: the later groups' gradients to check
        try:
            _threads.sync()  # BLAS threads: the program's or torch's count (docs/python.md)
        except Exception as e:
            failure = f"distmuon.torch.Muon: {e}"
        for gi, (group, (core, entries)) in enumerate(zip(self.param_groups, self._cores)):
            # The C++ step checks its own gradients' values; those of the later groups are
            # checked here too, so that group 0 does not step when a later group cannot.
            grads, active, why = self._check_group(gi, group, core, entries,
                                                   finite=later if gi > 0 else None)
            failure = failure or (f"distmuon.torch.Muon: {why}" if why else "")
            checked.append((grads, active))
        if not failure and later:
            bad = _first_nonfinite(later)
            failure = f"distmuon.torch.Muon: {bad}" if bad else ""
        for gi, ((core, entries), (grads, active)) in enumerate(zip(self._cores, checked)):
            why = failure if gi == 0 else ""
            with cuda_ordered(*core._cuda or (None,)):  # CUDA: PyTorch's stream, then the core's
                if not why:
                    for e in entries:  # low-precision parameters: their float32 copy
                        if e.work is not None:
                            e.work.copy_(e.p.detach())
                    if core._cuda is not None and grads is not None:
                        grads = [core_matrix(g, f"gradient {i}") if g is not None else None
                                 for i, g in enumerate(grads)]
                core._core.step([] if why or grads is None else grads, why,
                                [] if why or active is None else active)
                self._write_back(entries, active)
            _torch_live.refresh_steps(self._steps[gi], core)
        return loss

    @staticmethod
    def _write_back(entries, active):
        """After a group's step: low-precision parameters from their float32 copy, DTensors
        from their staged update."""
        for e in entries:
            if e.work is not None:
                e.p.detach().copy_(e.work)
            elif e.dt is not None and e.index is not None and active[e.index]:
                _dtensor.write_back([e.dt])  # DTensor: a staged update into its local tensor

    def _check_made(self, what):
        deferred = [gi for gi, (core, _) in enumerate(self._cores) if core is None]
        if deferred:
            raise Error(f"distmuon.torch.Muon.{what}: param group(s) {deferred} hold meta-device "
                        "parameters, whose state is made at the first step (step first)")

    def plan(self):
        """Per parameter of every group (a 3-D one once: rows x cols of each matrix, its batch
        and, after a step in owner mode or on homes, each matrix's owner): name, muon, rows,
        cols, tp/gtp sizes, mode, algorithm (the modes auto chose appear after the first step)."""
        return [info for core, _ in self._cores if core is not None
                for info in core.parameters()]

    def state_dict(self):
        """torch's format: {"state": {index: {"step", "momentum_buffer" | "exp_avg",
        "exp_avg_sq"}}, "param_groups": [{hyper-parameters..., "params": [index, ...]}]};
        the state tensors are float32 copies shaped like their parameters."""
        self._check_made("state_dict")
        return build_state_dict(self.param_groups, self._cores)

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of this optimizer (same groups and parameters on this rank).
        Collective: everything is checked on every rank and agreed before anything changes; a
        refusal raises on every rank (distmuon.CollectiveError) and changes nothing."""
        self._materialize()
        failure = ""
        try:
            check_state_dict(state_dict, self.param_groups, self._cores)
        except Exception as e:
            failure = describe_exception(e)
        self._world.agree_or_throw(not failure, "distmuon.torch.Muon.load_state_dict", failure)
        for group, saved, (core, entries) in zip(self.param_groups,
                                                 state_dict["param_groups"], self._cores):
            load_group_state(group, saved, state_dict["state"], core, entries)
        for steps, (core, _) in zip(self._steps, self._cores):
            _torch_live.refresh_steps(steps, core)

    def __deepcopy__(self, memo):
        """A new optimizer over deep copies of the parameters (as torch's optimizers copy),
        sharing the process groups, with this one's state. Collective, as construction is."""
        return _torch_live.deep_copy(self, memo)

    def __getstate__(self):
        return _torch_live.pickled(self)

    def __setstate__(self, saved):
        _torch_live.unpickle(self, saved)

    def save(self, path):
        """Checkpoints of the C++ format, one sub-directory per param group. Collective."""
        import os

        self._check_made("save")
        for gi, (core, _) in enumerate(self._cores):
            core.save(os.path.join(str(path), f"group{gi}"))

    def load(self, path):
        import os

        self._materialize()
        for gi, (core, _) in enumerate(self._cores):
            core.load(os.path.join(str(path), f"group{gi}"))
