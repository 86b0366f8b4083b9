"""distmuon.torch.Muon's state_dict / load_state_dict (torch's format).

(3) The one place where a parameter's state is built from, and written back to, the C++
optimizer's state tensors: param_state / set_param_state. load_state_dict checks everything
(check_state_dict) before anything changes (load_group_state, which cannot fail on a checked
state).
"""

import json
import math

import numpy as np
import torch

from . import Error, _dtensor
from ._torch_live import state_tensor
from ._types import describe_exception

_WHAT = "distmuon.torch.Muon.load_state_dict"
_NOT_SAVED = ("params", "layouts")


def _state_names(entry):
    return ("momentum_buffer",) if entry.muon else ("exp_avg", "exp_avg_sq")


def param_state(entry, core):
    """The state of one parameter: tensors shaped like it (copies; float32, or bfloat16 for a
    momentum kept in the parameter's dtype) and the step (empty ones for a 3-D parameter of no
    matrices, which is not registered and keeps none)."""
    st = {"step": torch.tensor(float(core.step_count))}
    mats = core.state_tensors(entry.index) if entry.index is not None else None
    for k, name in enumerate(_state_names(entry)):
        local = state_tensor(mats[k].copy()) if mats is not None else torch.zeros(0)
        if entry.dt is not None:  # DTensor: state as a DTensor like the parameter
            st[name] = _dtensor.wrap_state(entry.dt, entry.p, local)  # a batch: stacked by rows
            continue
        st[name] = local.reshape(entry.logical_shape).to(
            entry.p.device)  # a CUDA parameter's state on its device
    return st


def set_param_state(entry, core, st):
    """Writes a checked state (check_param_state) into the C++ optimizer's tensors."""
    if entry.index is None:
        return  # a 3-D parameter of no matrices: nothing registered, nothing kept
    shapes = [m.shape for m in core.state_tensors(entry.index)]
    for k, name in enumerate(_state_names(entry)):
        if entry.dt is not None:  # DTensor: its local state, padded as registered
            src = _dtensor.unwrap_state(entry.dt, entry.p, st[name], _WHAT).numpy()
        else:
            src = st[name].detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
        # Through the core: any backend's memory (a batch: its matrices stacked by rows).
        core._core.write_state(entry.index, k, np.ascontiguousarray(src.reshape(shapes[k])))


def check_param_state(entry, st, where):
    """Raises Error unless st is a state of this parameter: its keys, shapes, finite values,
    non-negative second moments, a whole step >= 0. Returns the step."""
    if not isinstance(st, dict):
        raise Error(f"{where}: the state is a {type(st).__name__}, not a dict")
    names = _state_names(entry)
    for key in ("step",) + names:
        if key not in st:
            other = sorted(k for k in st if k != "step")
            raise Error(f"{where}: no '{key}' in its state (it has {other}); "
                        f"{'a Muon' if entry.muon else 'an AdamW'} parameter of "
                        "distmuon.torch.Muon keeps " + ", ".join(names) +
                        " (a state of another optimizer?)")
    step = st["step"]
    step = float(step.item() if isinstance(step, torch.Tensor) and step.numel() == 1 else step) \
        if isinstance(step, (torch.Tensor, int, float)) else math.nan
    if not (math.isfinite(step) and step >= 0 and step == int(step)):
        raise Error(f"{where}: step {st['step']!r} is not a whole number >= 0")
    for key in names:
        t = st[key]
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise Error(f"{where}: '{key}' is {type(t).__name__}"
                        f"{' ' + str(t.dtype) if isinstance(t, torch.Tensor) else ''}, "
                        "not a floating-point tensor")
        if tuple(t.shape) != entry.logical_shape:
            raise Error(f"{where}: '{key}' is {tuple(t.shape)}, the parameter "
                        f"{entry.logical_shape}")
        if entry.dt is not None:  # DTensor: its placements; this rank's values (no collective)
            _dtensor.unwrap_state(entry.dt, entry.p, t, f"{where}: '{key}'")
            t = t._local_tensor if _dtensor.is_dtensor(t) else t
        if not bool(torch.isfinite(t).all()):
            raise Error(f"{where}: '{key}' has a non-finite value")
        if key == "exp_avg_sq" and bool((t < 0).any()):
            raise Error(f"{where}: 'exp_avg_sq' has a negative value")
    return int(step)


def build_state_dict(param_groups, cores):
    state, groups, index = {}, [], 0
    for group, (core, entries) in zip(param_groups, cores):
        saved = {k: v for k, v in group.items() if k not in _NOT_SAVED}
        saved["params"] = []
        for e in entries:
            state[index] = param_state(e, core)
            saved["params"].append(index)
            index += 1
        groups.append(saved)
    return {"state": state, "param_groups": groups}


def check_state_dict(sd, param_groups, cores):
    """Raises Error naming the first problem unless sd is a state_dict of this optimizer (same
    groups and parameters on this rank) with valid values throughout. Changes nothing."""
    from .torch import _GROUP_KEYS, group_options

    if not isinstance(sd, dict) or "state" not in sd or "param_groups" not in sd:
        raise Error(f"{_WHAT}: not an optimizer state dict (expected the keys 'state' and "
                    "'param_groups')")
    saved_groups, state = sd["param_groups"], sd["state"]
    if len(saved_groups) != len(param_groups):
        raise Error(f"{_WHAT}: the state has {len(saved_groups)} param group(s), the optimizer "
                    f"{len(param_groups)}")
    for gi, (group, saved, (core, entries)) in enumerate(zip(param_groups, saved_groups, cores)):
        where = f"{_WHAT}: param group {gi}"
        if not isinstance(saved, dict):
            raise Error(f"{where}: a {type(saved).__name__}, not a dict")
        for key in _GROUP_KEYS + ("initial_lr", "params"):
            if key not in saved:
                raise Error(f"{where} has no '{key}': not a state of distmuon.torch.Muon "
                            "(a state of another optimizer?)")
        if len(saved["params"]) != len(entries):
            raise Error(f"{where}: {len(saved['params'])} parameters in the state, "
                        f"{len(entries)} in the optimizer")
        merged = dict(group, **{k: v for k, v in saved.items() if k not in _NOT_SAVED})
        try:
            core._core.check_options(json.dumps(group_options(merged), sort_keys=True))
        except Exception as e:
            raise Error(f"{where}: {describe_exception(e)}") from None
        steps = set()
        for k, (pid, e) in enumerate(zip(saved["params"], entries)):
            if pid not in state:
                raise Error(f"{where}: no state for parameter {k} (index {pid!r})")
            steps.add(check_param_state(e, state[pid], f"{where}, parameter {k}"))
        if len(steps) > 1:
            raise Error(f"{where}: the parameters' steps differ ({sorted(steps)}); "
                        "distmuon.torch.Muon keeps one step count per group")


def load_group_state(group, saved, state, core, entries):
    """Applies a group's checked state: its hyper-parameters, each parameter's tensors, the
    step count (pushed to the C++ optimizer at the next step, which agrees them)."""
    for key, value in saved.items():
        if key not in _NOT_SAVED:
            group[key] = value
    step = None
    for pid, e in zip(saved["params"], entries):
        set_param_state(e, core, state[pid])
        step = state[pid]["step"]
    if step is not None:
        core._core.step_count = int(float(step))
