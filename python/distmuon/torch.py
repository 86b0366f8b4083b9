"""distmuon.torch.Muon: Muon as a torch.optim.Optimizer over CPU float32 parameters.

Each parameter may be this rank's shard of a larger weight. Its layout comes from, in order: the
param group's "layouts" list (one Layout per parameter, None for the default), the parameter's
`distmuon_layout` attribute, or the default (a 2-D parameter is a whole hidden matrix for Muon;
a 1-D parameter goes to AdamW). The C++ optimizer updates the parameters' storage in place.

Per param group (keys of param_groups, read at every step so that schedulers work): lr,
weight_decay (Muon), adamw_lr, adamw_weight_decay. Every other option (momentum, nesterov,
tp_mode, ns_algorithm, coefficients, steps, profile, ...) is fixed at construction.
"""

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from . import Communicator, Error, Muon as _CoreMuon, communicator
from . import _dtensor
from . import process_groups  # noqa: F401  (distmuon.torch.process_groups: the same helper)

_GROUP_KEYS = ("lr", "weight_decay", "adamw_lr", "adamw_weight_decay")


@dataclass
class Layout:
    """How this rank's parameter (the shard) sits in the full weight (docs/optimizer.md).

    rows x cols: the full, unpadded weight. tp_dim 0/1: split over tp_group (a
    distmuon.Communicator, a torch process group, or "world": the optimizer's process group).
    gtp_group: the TP-local tensor, padded with `pad` zero rows, split by rows over it.
    tp_pad: zero rows/columns extending the full weight along tp_dim (uneven TP shards).
    A DTensor parameter needs none: its layout comes from its mesh and placements (_dtensor.py).
    qkv_split: rows per query group of each block type. role: hidden (Muon), embedding,
    output_head or other (AdamW); use_muon False sends a hidden matrix to AdamW too.
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


def _default_layout(p):
    if p.dim() == 2:
        return Layout(rows=p.shape[0], cols=p.shape[1])
    if p.dim() == 1:
        return Layout(rows=p.shape[0], cols=1, role="other")
    raise Error(f"distmuon.torch.Muon: a {p.dim()}-D parameter needs a Layout "
                "(view it as a matrix first)")


class Muon(torch.optim.Optimizer):
    """Muon (and AdamW for the non-matrix parameters) on sharded CPU float32 parameters.

    process_group: None (one process), a torch.distributed group, "torch" (the default group)
    or a distmuon.Communicator / mpi4py communicator: the world of step() and the checkpoints.
    tp_mode "auto" (default) plans duplicated / distributed / owner per weight from the cost
    model, as the C++ API does; ns_algorithm "standard" (default) runs standard NS everywhere,
    "auto" lets the plan pick standard or Gram NS per weight as well. plan="measure" (with
    wisdom=FILE) times the plan's leading candidates before the first step. Other options are
    distmuon.Muon's (MuonOptions' JSON names).
    """

    def __init__(self, params, lr=0.02, weight_decay=0.0, adamw_lr=1e-3, adamw_weight_decay=0.0,
                 *, process_group=None, tp_mode="auto", **options):
        if process_group is None and torch.distributed.is_available() and \
                torch.distributed.is_initialized():
            process_group = "torch"
        self._world = communicator(process_group)
        self._group_comms = {} if process_group is None else {
            id(process_group): (process_group, self._world)}
        self._options = dict(options, tp_mode=tp_mode)
        self._cores = []  # one C++ optimizer per param group
        self._dtensor_entries = []  # per param group: per parameter, its _dtensor.Entry or None
        defaults = dict(lr=lr, weight_decay=weight_decay, adamw_lr=adamw_lr,
                        adamw_weight_decay=adamw_weight_decay)
        super().__init__(params, defaults)

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
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        gi = len(self.param_groups) - 1
        try:
            self._add_core(group, gi)
        except BaseException:
            self.param_groups.pop()
            raise

    def _add_core(self, group, gi):
        what = f"distmuon.torch.Muon: param group {gi}"
        # This rank's checks first, agreed before anything collective (an mpi4py group's
        # communicator is made by MPI_Comm_dup on every rank).
        failure = ""
        layouts, entries = [], []
        try:
            layouts = group.get("layouts") or [None] * len(group["params"])
            if len(layouts) != len(group["params"]):
                raise Error(f"{len(layouts)} layouts for {len(group['params'])} parameters")
            # DTensor parameters (FSDP2, TP): layout and updated tensor from the placements.
            entries = [_dtensor.entry(p, lo or getattr(p, "distmuon_layout", None), Layout,
                                      f"{k} of group {gi}") if _dtensor.is_dtensor(p) else None
                       for k, (p, lo) in enumerate(zip(group["params"], layouts))]
            for k, (p, e) in enumerate(zip(group["params"], entries)):
                if e is None and (p.dtype != torch.float32 or p.device.type != "cpu" or
                                  not p.is_contiguous()):
                    raise Error(f"parameter {k} is {p.dtype} on {p.device}"
                                f"{'' if p.is_contiguous() else ', strided'}; distmuon updates "
                                "contiguous CPU float32 parameters in place")
            layouts = [e.layout if e is not None else
                       layout or getattr(p, "distmuon_layout", None) or _default_layout(p)
                       for p, layout, e in zip(group["params"], layouts, entries)]
        except Exception as e:  # any refusal, whatever its type: agreed below
            failure = f"{type(e).__name__}: {e}"
        self._world.agree_or_throw(not failure, what, failure)
        groups = [(self._group_comm(lo.tp_group), self._group_comm(lo.gtp_group))
                  for lo in layouts]
        # Then the C++ checks of each shard against its layout (rank-local), agreed.
        core, addresses = None, []
        try:
            core = _CoreMuon(self._world, lr=group["lr"], weight_decay=group["weight_decay"],
                             adamw={"lr": group["adamw_lr"],
                                    "weight_decay": group["adamw_weight_decay"]},
                             **self._options)
            for k, (p, layout, (tp, gtp)) in enumerate(zip(group["params"], layouts, groups)):
                name = layout.name or f"group{gi}.param{k}"
                e = entries[k]  # DTensor: the local (or staged) tensor
                core.add_parameter(p.data if e is None else e.work, name, layout.rows,
                                   layout.cols, role=layout.role,
                                   use_muon=layout.use_muon, tp_dim=layout.tp_dim, tp_group=tp,
                                   gtp_group=gtp, pad=layout.pad, expert=layout.expert,
                                   expert_rank=layout.expert_rank, qkv_split=layout.qkv_split,
                                   tp_pad=layout.tp_pad)
                addresses.append(p.data_ptr() if e is None else e.local.data_ptr())
        except Exception as e:
            failure = f"{type(e).__name__}: {e}"
        self._world.agree_or_throw(not failure, what, failure)
        self._cores.append((core, addresses))
        self._dtensor_entries.append(entries)

    def _check_group(self, gi, group, core, addresses, finite):
        """This rank's gradients of param group gi, or the reason it cannot step (rank-local;
        finite: also look for a non-finite gradient, which the C++ step checks itself)."""
        grads = []
        for k, p in enumerate(group["params"]):
            e = self._dtensor_entries[gi][k]
            if e is not None:  # DTensor: its local gradient (staged when padded)
                why = _dtensor.check_storage(e, p)
                a, why = (None, why) if why else _dtensor.read_grad(e, p, finite)
                if why:
                    return None, f"DTensor parameter {k} of group {gi} {why}"
                grads.append(a)
                continue
            if p.data_ptr() != addresses[k]:
                return None, (f"parameter {k} of group {gi} was given new storage after the "
                              "optimizer was built (update it in place)")
            # The step is collective over every parameter: a missing gradient counts as zero.
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            if g.dtype != torch.float32 or g.device.type != "cpu" or not g.is_contiguous():
                return None, (f"the gradient of parameter {k} of group {gi} is {g.dtype} on "
                              f"{g.device}{'' if g.is_contiguous() else ', strided'}; expected "
                              "contiguous CPU float32")
            if g.shape != p.shape:
                return None, (f"the gradient of parameter {k} of group {gi} is "
                              f"{tuple(g.shape)}, the parameter {tuple(p.shape)}")
            if finite and not bool(torch.isfinite(g).all()):
                return None, f"the gradient of parameter {k} of group {gi} has a non-finite value"
            # Checked above: a NumPy view of the same memory (no copy), as the core takes it (a
            # vector as one column, as distmuon.Muon.step passes it).
            a = g.detach().numpy()
            grads.append(a.reshape(-1, 1) if a.ndim == 1 else a)
        try:
            core.set_learning_rates(group["lr"], group["adamw_lr"])
            core.set_weight_decays(group["weight_decay"], group["adamw_weight_decay"])
        except Exception as e:
            return None, f"group {gi}: {e}"
        return grads, ""

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every param group. Collective over the process group: every check of
        every group (storage, gradients, learning rates) is agreed on by all ranks, inside the
        first group's C++ step and before any update, so that a refusal on one rank raises
        distmuon.CollectiveError on every rank and no group has stepped."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        checked, failure = [], ""
        for gi, (group, (core, addresses)) in enumerate(zip(self.param_groups, self._cores)):
            # The C++ step checks its own gradients' values; those of the later groups are
            # checked here too, so that group 0 does not step when a later group cannot.
            grads, why = self._check_group(gi, group, core, addresses, finite=gi > 0)
            failure = failure or (f"distmuon.torch.Muon: {why}" if why else "")
            checked.append(grads)
        for gi, ((core, _), grads) in enumerate(zip(self._cores, checked)):
            # The arrays are checked views already: straight to the C++ step.
            why = failure if gi == 0 else ""
            core._core.step([] if why or grads is None else grads, why)
        for entries in self._dtensor_entries:  # DTensor: staged updates into the local tensors
            _dtensor.write_back(entries)
        return loss

    def plan(self):
        """Per parameter of every group: name, muon, rows, cols, tp/gtp sizes, mode, algorithm
        (the modes auto chose appear after the first step)."""
        return [info for core, _ in self._cores for info in core.parameters()]

    def state_dict(self):
        # The C++ state (copies) goes into the usual per-parameter state.
        for group, (core, _), entries in zip(self.param_groups, self._cores,
                                             self._dtensor_entries):
            for k, p in enumerate(group["params"]):
                tensors = [torch.from_numpy(t.copy()) for t in core.state_tensors(k)]
                if entries[k] is not None:  # DTensor: state as DTensors like the parameter
                    tensors = [_dtensor.wrap_state(entries[k], p, t) for t in tensors]
                st = {"step": torch.tensor(float(core.step_count))}
                if len(tensors) == 1:
                    st["momentum_buffer"] = tensors[0]
                else:
                    st["exp_avg"], st["exp_avg_sq"] = tensors
                self.state[p] = st
        return super().state_dict()

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for group, (core, _), entries in zip(self.param_groups, self._cores,
                                             self._dtensor_entries):
            for k, p in enumerate(group["params"]):
                st = self.state.get(p)
                if not st:
                    raise Error(f"distmuon.torch.Muon.load_state_dict: no state for parameter {k}")
                dst = core.state_tensors(k)
                src = [st["momentum_buffer"]] if len(dst) == 1 else [st["exp_avg"],
                                                                    st["exp_avg_sq"]]
                if entries[k] is not None:  # DTensor: its local state, padded as registered
                    src = [_dtensor.unwrap_state(entries[k], p, s, "distmuon.torch.Muon."
                                                 f"load_state_dict: parameter {k}") for s in src]
                for d, s in zip(dst, src):
                    if tuple(s.shape) != d.shape:
                        raise Error(f"distmuon.torch.Muon.load_state_dict: state of parameter "
                                    f"{k} is {tuple(s.shape)}, its shard {d.shape}")
                    d[...] = s.detach().numpy()
                core._core.step_count = int(st["step"])

    def save(self, path):
        """Checkpoints of the C++ format, one sub-directory per param group. Collective."""
        import os

        for gi, (core, _) in enumerate(self._cores):
            core.save(os.path.join(str(path), f"group{gi}"))

    def load(self, path):
        import os

        for gi, (core, _) in enumerate(self._cores):
            core.load(os.path.join(str(path), f"group{gi}"))
