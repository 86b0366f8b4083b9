"""distmuon.torch.Muon.state as torch's optimizers keep it (docs/python.md, "The state"), in one
process (pytest) and in two (torchrun, gloo; FSDP2 parameters too):

- opt.state[p] holds the live state under torch's names (momentum_buffer / exp_avg, exp_avg_sq,
  step), views of the C++ state (a DTensor like p under FSDP2);
- torch.distributed.checkpoint.state_dict.get_state_dict / set_state_dict leave the optimizer
  bit-unchanged (they step an optimizer whose state is empty) and the next step after a round
  trip is bit-equal to the next step of an untouched twin;
- copy.deepcopy and pickle give an optimizer whose next step is bit-equal.

All comparisons are exact (torch.equal): the same arithmetic on the same values.
"""
import copy
import io
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import distmuon.torch as dmt


@pytest.fixture(scope="module", autouse=True)
def _world():
    import os

    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.set_num_threads(1)
    yield


def _world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


class Net(nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.a = nn.Linear(12, 10)
        self.b = nn.Linear(10, 6)
        # 4-D: flattened to 4 x 27 (not as a DTensor: distmuon takes 1-D to 3-D DTensors); 3-D:
        # two 6 x 5 matrices, whose states lie apart (copies made when read)
        self.conv = nn.Conv2d(3, 4, 3) if conv else None
        self.batch = nn.Parameter(torch.randn(2, 6, 5)) if conv else None

    def forward(self, x, img):
        h = torch.tanh(self.a(x))
        out = self.b(h).sum()
        if self.conv is None:
            return out
        return out + self.conv(img).sum() + torch.einsum("bo,eoi->", h[:, :6], self.batch)


def _batch(step):
    g = torch.Generator().manual_seed(10 + step)
    return torch.randn(8, 12, generator=g), torch.randn(2, 3, 6, 6, generator=g)


def _train(model, opt, steps, start=0):
    for s in range(start, start + steps):
        opt.zero_grad()
        model(*_batch(s)).backward()
        opt.step()


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _snapshot(model, opt):
    sd = opt.state_dict()
    tensors = [_full(v).clone() for st in sd["state"].values() for v in st.values()]
    return [_full(p).detach().clone() for p in model.parameters()] + tensors


def _equal(xs, ys):
    return len(xs) == len(ys) and all(torch.equal(x, y) for x, y in zip(xs, ys))


def _model(fsdp):
    torch.manual_seed(3)
    net = Net(conv=not fsdp)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(net, mesh=init_device_mesh("cpu", (_world_size(),)))
    return net


def _pair(fsdp):
    """Two identical models with optimizers, trained 3 steps."""
    out = []
    for _ in range(2):
        m = _model(fsdp)
        opt = dmt.Muon(m.parameters(), lr=0.02, adamw_lr=0.01, tp_mode="duplicated")
        _train(m, opt, 3)
        out.append((m, opt))
    return out


FSDP = [False, True] if dist.is_available() else [False]


@pytest.mark.parametrize("fsdp", FSDP)
def test_state_holds_live_views(fsdp):
    if fsdp and not dist.is_initialized():
        pytest.skip("FSDP2 runs under torchrun (python_torch_state_views_torchrun2)")
    m = _model(fsdp)
    opt = dmt.Muon(m.parameters(), lr=0.02, tp_mode="duplicated")
    assert len(opt.state) == len(list(m.parameters()))  # state exists before the first step
    _train(m, opt, 2)
    sd = opt.state_dict()
    for i, p in enumerate(m.parameters()):
        st = opt.state[p]
        names = {"momentum_buffer", "step"} if p.dim() >= 2 else {"exp_avg", "exp_avg_sq", "step"}
        assert set(st) == names
        assert float(st["step"]) == 2.0
        for name in names - {"step"}:
            t = st[name]
            assert isinstance(t, torch.Tensor) and t.shape == p.shape
            if fsdp:
                from torch.distributed.tensor import DTensor

                assert isinstance(t, DTensor) and t.placements == p.placements
            assert torch.equal(_full(t), _full(sd["state"][i][name]))
    # A view: writing into the momentum writes the optimizer's state.
    w = m.a.weight
    buf = opt.state[w]["momentum_buffer"]
    local = buf._local_tensor if fsdp else buf
    local.fill_(0.5)
    k = next(i for i, q in enumerate(m.parameters()) if q is w)
    assert bool((_full(opt.state_dict()["state"][k]["momentum_buffer"]) == 0.5).all())


@pytest.mark.parametrize("fsdp", FSDP)
def test_torch_checkpoint_helpers_change_nothing(fsdp):
    if fsdp and not dist.is_initialized():
        pytest.skip("FSDP2 runs under torchrun (python_torch_state_views_torchrun2)")
    (m, opt), (m2, opt2) = _pair(fsdp)
    before = _snapshot(m, opt)
    msd, osd = get_state_dict(m, opt)
    assert _equal(_snapshot(m, opt), before), "get_state_dict changed the optimizer"
    msd, osd = copy.deepcopy(msd), copy.deepcopy(osd)  # the model's holds the live parameters
    _train(m, opt, 1, start=3)  # move on, then restore what get_state_dict gave
    set_state_dict(m, opt, model_state_dict=msd, optim_state_dict=osd)
    assert _equal(_snapshot(m, opt), before), "set_state_dict did not restore the state"
    _train(m, opt, 1, start=3)
    _train(m2, opt2, 1, start=3)
    assert _equal(_snapshot(m, opt), _snapshot(m2, opt2)), "the next step differs"


def test_deepcopy_and_pickle_give_working_optimizers():
    (m, opt), (m2, opt2) = _pair(False)
    copied_model, copied = copy.deepcopy((m, opt))  # together: the copy updates the copied model
    assert any(q is copied_model.a.weight for q in copied.param_groups[0]["params"])
    buf = io.BytesIO()
    pickle.dump((m, opt), buf)
    pm, popt = pickle.loads(buf.getvalue())
    for model, o in ((copied_model, copied), (pm, popt)):
        assert _equal(_snapshot(model, o), _snapshot(m2, opt2))
        _train(model, o, 2, start=3)
    _train(m2, opt2, 2, start=3)
    for model, o in ((copied_model, copied), (pm, popt)):
        assert _equal(_snapshot(model, o), _snapshot(m2, opt2))
    _train(m, opt, 2, start=3)  # the original still steps on its own parameters
    assert _equal(_snapshot(m, opt), _snapshot(m2, opt2))
