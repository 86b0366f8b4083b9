"""distmuon.torch.Muon.state: each parameter's state where torch's optimizers keep it.

opt.state[p] holds the C++ optimizer's own state of p under torch's names, so that code written
for torch's optimizers (torch.distributed.checkpoint.state_dict, which steps an optimizer whose
`state` is empty; inspection of `opt.state[p]["momentum_buffer"]`) sees it:

  "momentum_buffer" (Muon) or "exp_avg", "exp_avg_sq" (AdamW): a float32 tensor shaped like p
      that views the C++ state (writing into it writes the state); a DTensor like p for a DTensor
      parameter (its local tensor a view of the shard's state);
  "step": a float32 0-D tensor, the param group's step count, refreshed after each step and load.

Where no view can exist (a 3-D DTensor, whose local batch the C++ state stacks by rows; a backend
whose memory the host cannot read) the tensors are copies made when read (LazyState). A plain
3-D parameter is one C++ parameter of its batch: its state is a view too.
"""

import torch

from . import _dtensor


def state_tensor(a):
    """A state array of the C++ optimizer as a torch tensor over its memory: float32, or
    bfloat16 for a momentum kept in the parameter's dtype (its bits, a uint16 array)."""
    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if t.dtype == torch.uint16 else t


def state_names(entry):
    return ("momentum_buffer",) if entry.muon else ("exp_avg", "exp_avg_sq")


def _dtensor_view(e, p, t):
    """A state tensor t (the shard's, padded as registered) as a DTensor like p over t's memory."""
    from torch.distributed.tensor import DTensor

    r, c = (e.local.view(-1, 1) if e.flat else e.local).shape
    local = t[:r, :c]
    if e.flat:
        local = local.reshape(-1)  # a column of a k x 1 matrix: a view
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())


def _views(entry, core):
    """{name: view} of entry's state in core (a distmuon.Muon), or None where none can be."""
    if not core.backend.host_memory or entry.index is None or \
            (entry.dt is not None and entry.dt.batch):
        return None
    mats = core.state_tensors(entry.index)
    out = {}
    for k, name in enumerate(state_names(entry)):
        t = state_tensor(mats[k])  # the core's memory (the array keeps the core alive)
        out[name] = _dtensor_view(entry.dt, entry.p, t) if entry.dt is not None else \
            t.view(entry.logical_shape)
    return out


class LazyState(dict):
    """A parameter's state whose tensors are copies made when read (param_state); "step" is the
    live step tensor. Copies and pickles as a plain dict of its values."""

    def __init__(self, names, step, make):
        super().__init__({name: None for name in names}, step=step)
        self._make = make

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        return self._make()[key] if value is None else value

    def get(self, key, default=None):
        return self[key] if key in self else default

    def items(self):
        made = self._make()
        return [(k, made[k] if v is None else v) for k, v in dict.items(self)]

    def values(self):
        return [v for _, v in self.items()]

    def __repr__(self):
        return repr(dict(self.items()))

    def __reduce_ex__(self, protocol):
        return dict, (dict(self.items()),)


def attach(state, entries, core):
    """Puts each entry's state into `state` (the optimizer's, keyed by parameter). Returns the
    group's step tensors (one per parameter, as torch keeps them)."""
    from ._torch_state import param_state

    steps = []
    for e in entries:
        step = torch.tensor(float(core.step_count))
        views = _views(e, core)
        if views is not None:
            state[e.p] = dict(views, step=step)
        else:
            state[e.p] = LazyState(state_names(e), step,
                                   lambda e=e: param_state(e, core))
        steps.append(step)
    return steps


def refresh_steps(steps, core):
    """After a step or a load: the group's step tensors from its C++ step count."""
    n = float(core.step_count)
    for s in steps:
        s.fill_(n)


# ---- copy.deepcopy and pickle: a new optimizer built from the arguments, then given the state.

def _layout_groups(opt):
    """The group objects the parameters' layouts name (None and "world" left out)."""
    found = []
    for group in opt.param_groups:
        layouts = list(group.get("layouts") or [])
        layouts += [getattr(p, "distmuon_layout", None) for p in group["params"]]
        for lo in layouts:
            found += [getattr(lo, "tp_group", None), getattr(lo, "gtp_group", None)]
    return [g for g in found if g is not None and not isinstance(g, str)]


def _groups_of(opt):
    """The process-group objects an optimizer holds (its world's and its layouts'): a copy
    shares them, never copies them."""
    found = [opt._init_kwargs.get("process_group")] + _layout_groups(opt)
    for g, c in opt._group_comms.values():
        found += [g, c]
    return [g for g in found if g is not None and not isinstance(g, str)]


def _rebuild(opt, param_groups, kwargs, state):
    from .torch import Muon

    Muon.__init__(opt, param_groups, **kwargs)
    if state is not None:
        opt.load_state_dict(state)


def _state_of(opt):
    """opt's state_dict(), or None when no group has a state yet (meta-device parameters before
    the first step); a mix cannot be copied."""
    made = [core is not None for core, _ in opt._cores]
    if not any(made) and made:
        return None
    if not all(made):
        raise TypeError("distmuon.torch.Muon: an optimizer with meta-device parameters in some "
                        "groups cannot be copied before its first step")
    return opt.state_dict()


def deep_copy(opt, memo):
    import copy

    for g in _groups_of(opt):
        memo[id(g)] = g
    groups = copy.deepcopy([dict(g) for g in opt.param_groups], memo)
    kwargs = copy.deepcopy(opt._init_kwargs, memo)
    new = type(opt).__new__(type(opt))
    memo[id(opt)] = new
    _rebuild(new, groups, kwargs, _state_of(opt))
    return new


def _pickled_group(g):
    """A picklable stand-in for the optimizer's process group (torch's default group, or one
    process); raises TypeError for any other."""
    if g is None or (isinstance(g, str) and g == "torch"):
        return g
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and g is dist.group.WORLD:
        return "torch"
    raise TypeError("distmuon.torch.Muon: an optimizer over a process group other than torch's "
                    "default one cannot be pickled (save its state_dict() instead)")


def pickled(opt):
    """The pickled form: the arguments, the param groups (with their parameters) and the state."""
    if _layout_groups(opt):
        raise TypeError("distmuon.torch.Muon: an optimizer whose layouts name process groups "
                        "cannot be pickled (save its state_dict() instead)")
    kwargs = dict(opt._init_kwargs, process_group=_pickled_group(opt._init_kwargs["process_group"]))
    return {"kwargs": kwargs, "param_groups": [dict(g) for g in opt.param_groups],
            "state": _state_of(opt)}


def unpickle(opt, saved):
    _rebuild(opt, saved["param_groups"], saved["kwargs"], saved["state"])
