"""distmuon: the Muon optimizer on sharded weights, for Python (docs/python.md).

    import distmuon
    out = distmuon.newton_schulz(x)                   # NumPy array or CPU torch.Tensor
    opt = distmuon.Muon(comm=MPI.COMM_WORLD, tp_mode="auto")
    opt.add_parameter(shard, "fc1", rows=4096, cols=1024, tp_dim=0, tp_group=groups.tp)
    opt.step([grad])

The C++ library does the work: arrays are read and updated where they lie (no copies), the GIL
is released while it runs, and its errors arrive as distmuon.Error with the same message.
"""

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List

import numpy as np

# An installed wheel carries the library's data folders (hardware profiles, model presets).
_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
if os.path.isdir(_DATA):
    os.environ.setdefault("DISTMUON_DATA_DIR", _DATA)

from . import _core  # noqa: E402  (after the data folder is known)
from ._types import describe_exception, wrap_module as _wrap_module  # noqa: E402

_wrap_module(_core)  # argument type errors in plain words, not pybind11's overload listings
from ._arrays import as_array, _is_torch, backend_for, core_matrix, cuda_ordered, \
    is_low_precision
from ._core import CollectiveError, Communicator, Error, ProcessGroups

# Tracebacks name them as users import them: "distmuon.Error: ...", not the extension's module.
Error.__module__ = CollectiveError.__module__ = "distmuon"
from ._threads import blas_threads, set_blas_threads, sync as _sync_threads
from ._log import drain as _drain_log

__all__ = [
    "Error", "CollectiveError", "Communicator", "ProcessGroups", "newton_schulz", "communicator",
    "process_groups", "Muon", "plan", "Plan", "profiles", "calibrate", "coefficient_sets",
    "set_blas_threads", "blas_threads",
]


def coefficient_sets():
    """Names of the built-in Newton-Schulz coefficient sets."""
    return list(_core.coefficient_sets())


def newton_schulz(x, coefficients="quintic", steps=5, algorithm="standard", syrk=True,
                  gram_restart=0, out=None, inplace=False, allow_copy=False, device=None,
                  precision=None):
    """Newton-Schulz orthogonalisation of a matrix, or of each matrix of a 3-D batch (x[i] on
    its own), as `distmuon orthogonalize`.

    x: a NumPy array or torch.Tensor (CPU or CUDA), float32 row-major; a bfloat16 / float16
    tensor is computed on through a float32 working copy on its device. coefficients: a built-in
    set name (coefficient_sets()) or a list of (a, b, c) tuples (cycled). algorithm: "standard"
    or "gram". The input is read where it lies; the result goes into `out` (a new array/tensor of
    x's kind, device and dtype when None), or into x itself with inplace=True. allow_copy
    converts another dtype or a non-row-major input once instead of refusing it. device: None
    (the tensors' device), "cpu", "opaque" (CPU tensors through the device path, for tests) or
    "cuda" / "cuda:N"; a CUDA tensor is computed on where it lies, on PyTorch's current stream.
    precision: the arithmetic of NS's products, "fp32", "tf32" or "bf16" (operands rounded to that
    format, fp32 accumulation; the CPU emulates tf32 and bf16), or None / "auto" for the
    backend's default (fp32 on the CPU, bf16 on CUDA; docs/precision.md).
    Returns the result (same kind as x).
    """
    try:
        return _newton_schulz(x, coefficients, steps, algorithm, syrk, gram_restart, out,
                              inplace, allow_copy, device, precision)
    finally:
        _drain_log()


def _newton_schulz(x, coefficients, steps, algorithm, syrk, gram_restart, out, inplace,
                   allow_copy, device, precision):
    precision = _precision_name(precision, "newton_schulz")
    _sync_threads()
    custom = []
    if not isinstance(coefficients, str):
        try:
            custom = [tuple(float(v) for v in t) for t in coefficients]
        except (TypeError, ValueError):
            raise TypeError(f"newton_schulz: coefficients takes a set name or a list of (a, b, c) "
                            f"tuples, got {type(coefficients).__name__} {coefficients!r:.60}")
        coefficients = "custom"
    backend, kind, index = backend_for([x] if out is None else [x, out], device, "newton_schulz")
    args = (coefficients, custom, steps, algorithm, syrk, gram_restart, precision)
    if kind == "cuda" or is_low_precision(x) or (out is not None and is_low_precision(out)):
        return _newton_schulz_torch(x, out, inplace, allow_copy, backend, index, args)
    src = as_array(x, "newton_schulz input", allow_copy=allow_copy)
    if inplace:
        if out is not None:
            raise ValueError("newton_schulz: give out or inplace, not both")
        if src is not x and not _is_torch(x) and not isinstance(x, np.ndarray):
            raise ValueError("newton_schulz: inplace needs a NumPy array or a torch.Tensor")
        dst, result = src, x
        if allow_copy and not np.shares_memory(src, as_array(x, "newton_schulz input")):
            raise Error("newton_schulz: inplace on an input that needs a copy "
                        "(not float32 row-major)")
    elif out is not None:
        dst, result = as_array(out, "newton_schulz out"), out
    else:
        if src.ndim not in (2, 3):
            raise Error(f"newton_schulz input: expected a 2-D array or a 3-D batch, got "
                        f"{src.ndim} dimension(s)")
        dst = np.empty(src.shape, dtype=np.float32)
        result = dst
        if _is_torch(x):
            import torch

            result = torch.from_numpy(dst)
    if src.ndim == 3 or getattr(dst, "ndim", 0) == 3:
        if src.ndim != 3 or dst.ndim != 3 or src.shape[0] != dst.shape[0]:
            raise Error(f"newton_schulz: output {dst.shape} for an input {src.shape}")
        # Each matrix of the batch on its own, into a working batch copied to dst at the end: a
        # matrix that fails leaves the caller's out (or x, in place) as it was, earlier ones too.
        work = dst if out is None and not inplace else np.empty(src.shape, dtype=np.float32)
        for i in range(src.shape[0]):
            _core.newton_schulz(src[i], work[i], backend, *args)
        if work is not dst:
            dst[...] = work
        return result
    _core.newton_schulz(src, dst, backend, *args)
    return result


def _newton_schulz_torch(x, out, inplace, allow_copy, backend, index, args):
    """newton_schulz on torch tensors that are CUDA or of low precision: float32 working copies
    (made on the tensors' device) where x or out is not float32 row-major."""
    import torch

    if not _is_torch(x) or (out is not None and not _is_torch(out)):
        raise Error("newton_schulz: a CUDA or low-precision tensor with a non-tensor input/out")
    if inplace and out is not None:
        raise ValueError("newton_schulz: give out or inplace, not both")
    if x.dim() not in (2, 3):
        raise Error(f"newton_schulz input: expected a 2-D array or a 3-D batch, got {x.dim()} "
                    "dimension(s)")
    src = x.detach()
    if src.dtype != torch.float32:
        if not (is_low_precision(src) or allow_copy):
            raise Error(f"newton_schulz input: expected a float32, bfloat16 or float16 tensor, "
                        f"got {src.dtype}")
        src = src.to(torch.float32).contiguous()  # the working copy, on x's device
    elif allow_copy and not src.is_contiguous():
        src = src.contiguous()
    target = x if inplace else out
    if target is None:
        dst = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    elif target.dtype == torch.float32 and src.dim() == 2 and (
            not inplace or src.data_ptr() == x.data_ptr()):
        dst = target.detach()  # one matrix: the core leaves it unchanged when NS fails
    else:
        dst = torch.empty(target.shape, dtype=torch.float32, device=target.device)
    if src.dim() != dst.dim() or (src.dim() == 3 and src.shape[0] != dst.shape[0]):
        raise Error(f"newton_schulz: output {tuple(dst.shape)} for an input {tuple(src.shape)}")
    pairs = [(src, dst)] if src.dim() == 2 else list(zip(src.unbind(0), dst.unbind(0)))
    with cuda_ordered(index):
        for s, d in pairs:
            _core.newton_schulz(core_matrix(s, "newton_schulz input"),
                                core_matrix(d, "newton_schulz output"), backend, *args)
    if target is None:
        return dst if x.dtype == torch.float32 else dst.to(x.dtype)
    if dst.data_ptr() != target.data_ptr():
        target.detach().copy_(dst)  # back into the caller's dtype
    return target


PRECISIONS = tuple(_core.precision_names().split(", "))  # the C++ core's names


def _precision_name(precision, where):
    """precision= as the C++ core's name: "fp32", "tf32", "bf16", or "auto" for None."""
    if precision is None or precision == "auto":
        return "auto"
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"{where}: precision must be one of {', '.join(PRECISIONS)}, 'auto' or "
                         f"None, got {precision!r:.60}")
    return precision


def communicator(obj=None):
    """A distmuon.Communicator from: None (one rank), a Communicator, an mpi4py communicator
    (MPI.COMM_WORLD or a split; distmuon duplicates it), or a torch.distributed process group
    (or the string "torch" for torch's default group)."""
    if obj is None:
        return _core.local_communicator()
    if isinstance(obj, Communicator):
        return obj
    mod = type(obj).__module__
    if mod.startswith("mpi4py"):
        return _core.mpi4py_communicator(obj)
    if obj == "torch" or mod.startswith("torch"):
        from ._torch_comm import TorchCollectives

        return _core.callback_communicator(TorchCollectives(None if obj == "torch" else obj))
    raise TypeError(f"communicator: cannot make a communicator from {type(obj).__name__}")


def process_groups(world, tp_size, gtp_size):
    """TP x GTP x replica groups of `world` (TP varying fastest): .tp, .gtp, .dp, .world."""
    return _core.make_process_groups(communicator(world), tp_size, gtp_size)


def _options_json(options):
    """Muon's options as the JSON the C++ core reads; a non-finite number (which JSON cannot hold)
    or a value that is no JSON value is refused naming the option."""

    def check(prefix, values):
        for key, value in values.items():
            if isinstance(value, dict):
                check(f"{prefix}{key}.", value)
            elif isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"Muon: option '{prefix}{key}' must be a finite number, got {value}")
            elif not isinstance(value, (str, int, float, bool, type(None))):
                raise TypeError(
                    f"Muon: option '{prefix}{key}' has type {type(value).__name__}; "
                    "options are numbers, strings, booleans or (adamw) a dict"
                )

    check("", options)
    return json.dumps(options)



def _stacked(x, what):
    """A row-major 3-D array or tensor [E, r, c] as its (E r) x c view (no copy: the optimizer
    updates it in place)."""
    if _is_torch(x):
        if not x.is_contiguous():
            raise Error(f"{what}: a strided 3-D tensor; distmuon takes row-major (contiguous) "
                        "batches")
        return x.detach().view(-1, x.shape[-1])
    arr = as_array(x, what)
    if not arr.flags.c_contiguous:
        raise Error(f"{what}: a strided 3-D array; distmuon takes row-major (contiguous) batches")
    return arr.reshape(-1, arr.shape[-1])

def _float32(a):
    """A copy of a state array in float32 (a bfloat16 momentum's bits unpacked: exact)."""
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.copy()


class Muon:
    """The Muon optimizer over this rank's shards (C++ distmuon::Muon).

    Options are MuonOptions' fields by their JSON names (lr, momentum, nesterov, weight_decay,
    weight_decay_method, coefficients, custom_coefficients, steps, use_syrk, ns_algorithm,
    gram_restart, precision ("fp32", "tf32", "bf16", or None / "auto": the backend's default),
    scale_mode, extra_scale_factor, tp_mode, cost_model, profile, plan ("estimate" or
    "measure"), wisdom, step_timeout_s (the step deadline in seconds: a rank that does not reach a
    step within it of rank 0 is named in a distmuon.Error on the others; needs an MPI
    communicator; docs/reliability.md), adamw={...}); an option not given keeps MuonOptions'
    default.
    comm: the world (see communicator()). step(), save() and load() are collective over it.
    """

    def __init__(self, comm=None, device=None, **options):
        if "precision" in options:
            options["precision"] = _precision_name(options["precision"], "Muon")
        self.world = communicator(comm)
        _sync_threads()
        # The backend of every parameter and gradient: "cpu" (None), "opaque" (CPU tensors
        # staged through the device path) or "cuda" / "cuda:N" (CUDA tensors where they lie, on
        # PyTorch's current stream of that device at construction).
        self.backend, self.device, self._cuda = _muon_backend(device)
        try:
            self._core = _core.MuonCore(_options_json(options), self.world, self.backend)
        finally:
            _drain_log(self.world.rank)
        self._shards = []
        # One Communicator per group object: parameters passed the same group share it (owner
        # mode buckets weights by their groups), and an mpi4py group is duplicated once.
        self._groups = {id(comm): (comm, self.world)} if comm is not None else {}

    def _group(self, obj):
        if obj is None or isinstance(obj, Communicator):
            return obj
        if id(obj) not in self._groups:
            self._groups[id(obj)] = (obj, communicator(obj))  # obj kept: its id stays unique
        return self._groups[id(obj)][1]

    def add_parameter(self, shard, name, rows=None, cols=None, *, role="hidden", use_muon=True,
                      tp_dim=None, tp_group=None, gtp_group=None, pad=0, expert=False,
                      expert_rank=0, qkv_split=(), tp_pad=0, data_parallel_group=None,
                      batch=None):
        """Registers this rank's shard (updated in place by step()). rows x cols is the full
        unpadded weight (default: the shard's shape); tp_dim 0/1 with tp_group splits it over
        TP, gtp_group splits the (padded by `pad` rows) TP-local tensor by rows over GTP.
        tp_pad zero rows/columns extend the full weight along tp_dim before the TP split (uneven TP
        shards as torch.chunk cuts them; the shard holds its padding, zero). A group is a
        Communicator or anything communicator() accepts (converted once per object). A 1-D shard
        is registered as a k x 1 column. data_parallel_group: the ranks holding the same shard
        (its replicas, e.g. the DDP world); Muon then orthogonalises it once, on one home rank of
        them (options' replica_mode; docs/data-parallel.md). A 3-D shard [E, r, c] (row-major)
        is a batch of E matrices in one parameter (e.g. experts; rows x cols default to each
        matrix's shape): each orthogonalised on its own, equal shapes together (batched NS);
        batch=E also takes them stacked by rows in a 2-D (E r) x c shard. Returns its index."""
        what = f"Muon parameter '{name}'"
        self._check_device(shard, what)
        if getattr(shard, "ndim", 0) == 3:
            shape = tuple(shard.shape)
            if batch is not None and batch != shape[0]:
                raise Error(f"{what}: batch={batch} for a 3-D shard of {shape[0]} matrices")
            batch = shape[0]
            rows = shape[1] if rows is None else rows
            cols = shape[2] if cols is None else cols
            shard = _stacked(shard, what)
        batch = 1 if batch is None else batch
        bf16 = _is_torch(shard) and str(shard.dtype) == "torch.bfloat16"
        if bf16:  # updated where it lies (docs/python.md)
            keep, arr = shard, self._bf16_matrix(shard, what)
            rows = arr.shape[0] if rows is None else rows
            cols = arr.shape[1] if cols is None else cols
        elif self._cuda is not None:
            arr = shard.reshape(-1, 1) if shard.dim() == 1 else shard
            rows = arr.shape[0] if rows is None else rows
            cols = arr.shape[1] if cols is None and arr.dim() == 2 else cols
            arr = keep = core_matrix(arr.detach(), what)
        else:
            arr = as_array(shard, what)
            if arr.ndim == 1:
                arr = arr.reshape(-1, 1)
            rows = arr.shape[0] if rows is None else rows
            cols = arr.shape[1] if cols is None and arr.ndim == 2 else cols
            keep = arr
        i = self._core.add_parameter(
            arr, name, rows, cols, role, use_muon, tp_dim,
            self._group(tp_group), self._group(gtp_group), pad, expert, expert_rank,
            list(qkv_split), tp_pad,
            self._group(data_parallel_group), batch, bf16=bf16)
        self._shards.append(keep)  # its memory stays alive with the optimizer
        return i

    def _bf16_matrix(self, shard, what):
        """A bfloat16 tensor's memory as the core takes a bfloat16 weight, updated where it lies
        without a float32 copy between steps (each step unpacks it into one, steps that and
        rounds the new weight back): its 2-D bits (int16) on the CPU, a DeviceTensor on CUDA."""
        if self.device == "opaque":
            raise Error(f"{what}: a bfloat16 tensor for device 'opaque' (which computes on its own "
                        "copies only; pass a float32 tensor)")
        if not shard.is_contiguous():
            raise Error(f"{what}: a strided bfloat16 tensor (distmuon updates contiguous ones)")
        import torch

        t = shard.detach()
        t = t.view(-1, 1) if t.dim() <= 1 else t if t.dim() == 2 else t.view(t.shape[0], -1)
        if self._cuda is not None:
            return _core.DeviceTensor(t.data_ptr(), t.shape[0], t.shape[1], t.shape[1],
                                      t.device.index)
        return t.view(torch.int16).numpy()  # the bf16 bits, in place

    def step(self, grads, failure=""):
        """One step; grads[i] is the gradient of shard i (same shape, float32). Collective: a
        gradient refused on one rank (or a non-empty `failure`, the caller's own check on this
        rank) raises distmuon.CollectiveError on every rank, before anything is updated."""
        arrays = []
        if not failure:
            try:
                _sync_threads()
                if not isinstance(grads, (list, tuple)):
                    raise TypeError(f"Muon.step: grads takes a list of arrays, got "
                                    f"{type(grads).__name__}")
                for i, g in enumerate(grads):
                    arrays.append(self._matrix(g, f"gradient {i}"))
            except Exception as e:  # any refusal, whatever its type, is agreed on
                failure = describe_exception(e)
        try:
            with cuda_ordered(*self._cuda or (None,)):
                self._core.step([] if failure else arrays, failure)
        finally:
            _drain_log(self.world.rank)

    def _check_device(self, t, what):
        """Raises Error unless t is on this optimizer's device (host memory for cpu / opaque)."""
        where = "cpu" if not (_is_torch(t) and t.device.type != "cpu") else str(t.device)
        if self._cuda is None and where != "cpu":
            raise Error(f"{what}: a tensor on {where} for an optimizer on device "
                        f"{self.device!r} (CUDA tensors need device=\"cuda\")")
        if self._cuda is not None and where != f"cuda:{self._cuda[0]}":
            raise Error(f"{what}: a tensor on {where} for an optimizer on cuda:{self._cuda[0]}")

    def _matrix(self, g, what):
        """A gradient (or 1-D: a column) as the core takes it on this optimizer's device."""
        if g is None:
            return None
        self._check_device(g, what)
        if getattr(g, "ndim", 0) == 3:  # a batched parameter's gradient: stacked by rows
            g = _stacked(g, what)
        if self._cuda is not None:
            return core_matrix((g.reshape(-1, 1) if g.dim() == 1 else g).detach(), what)
        a = as_array(g, what)
        return a.reshape(-1, 1) if a.ndim == 1 else a

    def memory_stats(self):
        """The backend's memory: allocations, releases, live / peak bytes, and the uploads and
        downloads (count, bytes) of staged parameters and gradients (device "opaque")."""
        return self.backend.memory_stats()

    def set_learning_rates(self, lr, adamw_lr=None):
        """New learning rates for the next steps (adamw_lr None: unchanged)."""
        if adamw_lr is None:
            adamw_lr = self.options["adamw"]["lr"]
        self._core.set_learning_rates(lr, adamw_lr)

    def set_weight_decays(self, weight_decay, adamw_weight_decay=None):
        """New weight decays for the next steps (adamw_weight_decay None: unchanged)."""
        if adamw_weight_decay is None:
            adamw_weight_decay = self.options["adamw"]["weight_decay"]
        self._core.set_weight_decays(weight_decay, adamw_weight_decay)

    @property
    def options(self):
        return json.loads(self._core.options())

    @property
    def step_count(self):
        return self._core.step_count

    def parameters(self):
        """Per parameter: name, muon, rows, cols, tp_size, gtp_size, mode, algorithm,
        crosses_domain, dp_size (replicas), home (orthogonalised on one home rank of them) and
        owner (owner mode or home: its owner index after a step, else -1)."""
        return self._core.parameters()

    def last_step_stats(self):
        """(total seconds, seconds in the parameters' collectives) of the last step."""
        return self._core.last_step_stats()

    def state_tensors(self, i):
        """Parameter i's state as arrays over the optimizer's memory (Muon: [momentum]; AdamW:
        [exp_avg, exp_avg_sq]). A momentum kept in bfloat16 (momentum_dtype="param" on a
        bfloat16 parameter) is a uint16 array of its bits (torch views it as bfloat16)."""
        return self._core.state_tensors(i)

    def state_dict(self):
        """This rank's state: {"step", "options", "params": [{"name", "state": [arrays]}]}
        (copies)."""
        params = []
        for i, info in enumerate(self.parameters()):
            params.append({"name": info["name"],
                           "state": [_float32(t) for t in self._core.state_tensors(i)]})
        return {"step": self.step_count, "options": self.options, "params": params}

    def load_state_dict(self, state):
        """Restores a state_dict() of an optimizer with the same parameters on this rank. Every
        tensor is checked (its parameter, its shape, finite values) and the step count too before
        anything is written: a state that does not fit raises Error and changes nothing."""
        infos = self.parameters()
        _check_muon_state(state, len(infos))
        if len(state["params"]) != len(infos):
            raise Error(f"Muon.load_state_dict: {len(state['params'])} parameters in the state, "
                        f"{len(infos)} registered")
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, (int, np.integer, float, np.floating)) \
                or not math.isfinite(step) or step < 0 or step != int(step):
            raise Error(f"Muon.load_state_dict: the step count must be an integer >= 0, got "
                        f"{step!r}; nothing is loaded")
        writes = []
        for i, (saved, info) in enumerate(zip(state["params"], infos)):
            if saved["name"] != info["name"]:
                raise Error(f"Muon.load_state_dict: parameter {i} is '{info['name']}' but the "
                            f"state holds '{saved['name']}'")
            dst = self._core.state_tensors(i)
            if len(dst) != len(saved["state"]):
                raise Error(f"Muon.load_state_dict: '{info['name']}' has {len(dst)} state "
                            f"tensor(s), the state {len(saved['state'])}")
            for k, (d, s) in enumerate(zip(dst, saved["state"])):
                s = np.asarray(as_array(s, f"state of '{info['name']}'"))
                if s.shape != d.shape:
                    raise Error(f"Muon.load_state_dict: state of '{info['name']}' is "
                                f"{s.shape}, its shard {d.shape}")
                bad = np.argwhere(~np.isfinite(s))
                if len(bad):
                    at = ", ".join(str(int(x)) for x in bad[0])
                    raise Error(f"Muon.load_state_dict: state tensor {k} of '{info['name']}' has "
                                f"a non-finite value ({s[tuple(bad[0])]}) at ({at}); an "
                                f"optimizer state holds finite values only, nothing is loaded")
                writes.append((i, k, np.ascontiguousarray(s)))
        for i, k, s in writes:
            self._core.write_state(i, k, s)
        self._core.step_count = int(step)

    def save(self, path):
        """Checkpoint directory (the C++ format: manifest.json + per-rank files). Collective."""
        try:
            self._core.save(os.fspath(path))
        finally:
            _drain_log(self.world.rank)

    def load(self, path):
        """Loads a checkpoint written by save() here or by the C++ Muon::save. Collective."""
        try:
            self._core.load(os.fspath(path))
        finally:
            _drain_log(self.world.rank)


def _check_muon_state(state, count):
    """A KeyError or TypeError deep in load_state_dict, said as what the state lacks."""
    where = "Muon.load_state_dict"
    if not isinstance(state, dict):
        raise Error(f"{where}: expected the dict of a state_dict(), got {type(state).__name__}")
    for key, kind in (("params", "a list of parameters"), ("step", "the step count")):
        if key not in state:
            raise Error(f"{where}: the state has no '{key}' ({kind}); expected a state_dict() "
                        "of distmuon.Muon")
    if not isinstance(state["params"], (list, tuple)):
        raise Error(f"{where}: the state's 'params' must be a list, got "
                    f"{type(state['params']).__name__}")
    for i, saved in enumerate(state["params"][:count]):
        for key in ("name", "state"):
            if not isinstance(saved, dict) or key not in saved:
                raise Error(f"{where}: parameter {i} of the state has no '{key}'")


def _muon_backend(device):
    """(backend, device name, (CUDA index, stream) or None) of an optimizer."""
    name = "cpu" if device is None else str(device)
    if name.split(":")[0] == "cuda":
        backend, _, index = backend_for([], name, "Muon")
        import torch

        return backend, f"cuda:{index}", (index, torch.cuda.current_stream(index).cuda_stream)
    backend, kind, _ = backend_for([], name, "Muon")
    return backend, kind, None


@dataclass
class Plan:
    """The cost model's plan: one entry per distinct weight shape (mode, costs per candidate,
    breakdown), the totals, units ("seconds" with a profile, "flops" without), and the text
    table `distmuon plan` prints."""
    weights: List[Dict[str, Any]]
    totals: Dict[str, Any]
    units: str
    options: Any
    table: str = field(repr=False, default="")

    def __str__(self):
        return self.table


def plan(shapes=None, group_size=8, *, model=None, profile="none", crosses_domain=None,
         partition_dim=0, steps=5, syrk=True, elem_size=2, algorithm="standard",
         cost_model="refined"):
    """Plans every Muon weight: shapes is a list of (m, n), (name, m, n) or
    (name, m, n, count); or model names a preset ("llama3-70b", a JSON file, "train-default").
    profile: "none" (FLOPs), a built-in profile name or a calibrated JSON file (seconds).
    algorithm: the NS algorithms auto may pick, as `distmuon plan --ns-algorithm`: "standard"
    (the optimizer's default), "auto" (standard or gram) or "gram". The defaults are
    `distmuon plan`'s."""
    if isinstance(shapes, str) and model is None:
        shapes, model = None, shapes
    rows = []
    if shapes is not None and not isinstance(shapes, (list, tuple)):
        raise TypeError(f"plan: shapes takes a list of (m, n), (name, m, n) or (name, m, n, count) "
                        f"tuples, got {type(shapes).__name__}")
    for k, s in enumerate(shapes or []):
        s = tuple(s)
        if len(s) == 2:
            rows.append((f"w{k}", int(s[0]), int(s[1]), 1, False))
        elif len(s) == 3:
            rows.append((str(s[0]), int(s[1]), int(s[2]), 1, False))
        else:
            rows.append((str(s[0]), int(s[1]), int(s[2]), int(s[3]), bool(s[4]) if len(s) > 4
                         else False))
    try:
        text, table = _core.plan(rows, model or "", group_size, profile, crosses_domain,
                                 partition_dim, steps, syrk, elem_size, algorithm, cost_model)
    finally:
        _drain_log()
    j = json.loads(text)
    return Plan(weights=j["weights"], totals=j["totals"], units=j["units"],
                options=j.get("options"), table=table)


def profiles():
    """The built-in hardware profiles (datasheet figures with their sources), as dicts."""
    return json.loads(_core.profiles())


def calibrate(comm=None, name="calibrated", sizes=(), max_bytes=0, out=None, device="cpu"):
    """Measures this machine (GEMM rates, elementwise passes, collectives over comm) into a
    profile dict that plan(profile=...) and Muon(profile=...) accept once written to a file.
    out=PATH: rank 0 writes it atomically, as `distmuon calibrate --out`; a path that cannot be
    written is refused on every rank before the measurements. Collective over comm. Returns
    (profile, report text). device: the backend measured ("cpu", "opaque" or "cuda")."""
    backend = backend_for([], device, "calibrate")[0]
    _sync_threads()
    try:
        text, report = _core.calibrate(communicator(comm), name, list(sizes), int(max_bytes),
                                       None if out is None else os.fspath(out), backend)
    finally:
        _drain_log()
    return json.loads(text), report
