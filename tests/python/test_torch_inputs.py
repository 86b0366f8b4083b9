"""Inputs torch.optim.Muon takes, in distmuon.torch.Muon (docs/python.md, "What differs from
torch.optim.Muon"): each works, equal to the computation on the contiguous parameter (bit-equal:
the same arithmetic on the same values) or to torch.optim.Muon, or is refused with its reason.
"""
import logging

import pytest
import torch
import torch.optim._muon as torch_muon

import distmuon
import distmuon.torch as dmt
from torch_reference import fp32_zeropower


def _steps(params, grads, n=3, **kw):
    opt = dmt.Muon(params, lr=0.02, tp_mode="duplicated", **kw)
    for s in range(n):
        for p, g in zip(params, grads):
            p.grad = g(s)
        opt.step()
    return opt


def _grad(shape, seed, memory_format=None):
    def make(step):
        g = torch.randn(*shape, generator=torch.Generator().manual_seed(seed + step))
        return g.contiguous(memory_format=memory_format) if memory_format else g
    return make


def test_strided_and_channels_last_parameters_step_as_contiguous_ones():
    torch.manual_seed(0)
    base_t = torch.randn(12, 20)
    base_c = torch.randn(8, 3, 3, 3)
    # A transposed parameter (20 x 12, strides (1, 20)) and a channels_last conv weight.
    pt = torch.nn.Parameter(base_t.clone().t())
    pc = torch.nn.Parameter(base_c.clone().contiguous(memory_format=torch.channels_last))
    assert not pt.is_contiguous() and not pc.is_contiguous()
    qt = torch.nn.Parameter(base_t.clone().t().contiguous())
    qc = torch.nn.Parameter(base_c.clone())
    gt, gc = _grad((20, 12), 1), _grad((8, 3, 3, 3), 2)
    gcl = _grad((8, 3, 3, 3), 2, torch.channels_last)
    opt = _steps([pt, pc], [lambda s: gt(s).t().contiguous().t(), gcl])
    ref = _steps([qt, qc], [gt, gc])
    assert torch.equal(pt, qt) and torch.equal(pc, qc)
    assert pt.stride() == (1, 20) and pc.is_contiguous(memory_format=torch.channels_last)
    assert not torch.equal(pt, base_t.t())  # it moved
    assert torch.equal(opt.state[pt]["momentum_buffer"], ref.state[qt]["momentum_buffer"])


def test_momentum_one_keeps_the_buffer_as_torch_does():
    torch.manual_seed(1)
    w0 = torch.randn(16, 24)
    p, q = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    g = _grad((16, 24), 3)
    opt = _steps([p], [g], momentum=1.0)
    ref = torch.optim.Muon([q], lr=0.02, momentum=1.0)
    for s in range(3):
        q.grad = g(s)
        ref.step()
    # The buffer stays zero, the update is zero: only the weight decay moves the weights.
    assert torch.equal(opt.state[p]["momentum_buffer"], torch.zeros(16, 24))
    assert torch.allclose(p, q, rtol=1e-6, atol=0) and not torch.equal(p, w0)


@pytest.mark.parametrize("kw,why", [
    (dict(momentum=1.5), "momentum should be <= 1 but is: 1.5 \\(above 1 the momentum buffer"),
    (dict(eps=0.0), "eps should be > 0 but is: 0.0 \\(with eps 0 a zero update"),
])
def test_diverging_values_refused_with_their_reason(kw, why):
    with pytest.raises(ValueError, match=why):
        dmt.Muon([torch.nn.Parameter(torch.zeros(4, 4))], **kw)


# Schedules torch runs that end outside their band (under-converged): run, with one warning.
UNDER = [dict(ns_steps=1), dict(ns_steps=2), dict(ns_steps=3),
         dict(ns_coefficients=(1.5, -0.5, 0.0))]  # the classic cubic, 5 steps


@pytest.mark.parametrize("kw", UNDER)
def test_under_converging_schedules_run_as_torch_runs_them(kw, monkeypatch, caplog):
    """Within 1e-5 relative of torch.optim.Muon with its NS in fp32 after 5 steps (fp32 rounding
    of different GEMMs; a few NS steps amplify it little)."""
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", fp32_zeropower)
    torch.manual_seed(7)
    w0 = [torch.randn(32, 20), torch.randn(16, 40)]
    ours = [torch.nn.Parameter(w.clone()) for w in w0]
    theirs = [torch.nn.Parameter(w.clone()) for w in w0]
    with caplog.at_level(logging.WARNING, logger="distmuon"):
        opt = dmt.Muon(ours, lr=0.02, **kw)
        ref = torch.optim.Muon(theirs, lr=0.02, **kw)
        for s in range(5):
            g = torch.Generator().manual_seed(s)
            for p, q in zip(ours, theirs):
                p.grad = torch.randn(p.shape, generator=g)
                q.grad = p.grad.clone()
            opt.step()
            ref.step()
    for p, q in zip(ours, theirs):
        assert float((p - q).detach().norm() / q.detach().norm()) < 1e-5
    warned = [r.getMessage() for r in caplog.records if r.name == "distmuon"]
    assert len(warned) <= 1 and all("does not fully orthogonalise" in w for w in warned)


def test_schedule_warning_once_and_strict_refusal(caplog):
    odd = (1.5, -0.5, 0.0)
    with caplog.at_level(logging.WARNING, logger="distmuon"):
        for _ in range(2):
            dmt.Muon([torch.nn.Parameter(torch.zeros(4, 4))], ns_coefficients=odd, ns_steps=4)
    warned = [r.getMessage() for r in caplog.records if r.name == "distmuon"]
    assert len(warned) == 1 and "at 4 steps does not fully orthogonalise" in warned[0]
    with pytest.raises(distmuon.Error, match="does not orthogonalise: it maps"):
        dmt.Muon([torch.nn.Parameter(torch.zeros(4, 4))], ns_coefficients=odd, ns_steps=4,
                 schedule_check="strict")


@pytest.mark.parametrize("coefficients,why", [
    ((4.0, -7.0, 2.5), "reversed or cancelled direction"),   # p(1) < 0
    ((3.0, 0.0, 0.0), "a blown-up direction"),               # x -> 3x: 1 -> 3^5
])
def test_reversing_or_blowing_up_schedules_refused(coefficients, why):
    with pytest.raises(distmuon.Error, match=why):
        dmt.Muon([torch.nn.Parameter(torch.zeros(4, 4))], ns_coefficients=coefficients)


def test_meta_parameters_get_their_state_at_the_first_step():
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)  # to_empty keeps the objects
    try:
        with torch.device("meta"):
            m = torch.nn.Linear(12, 8)
        opt = dmt.Muon(m.parameters(), lr=0.02, adamw_lr=0.01)
        assert len(opt.state) == 0
        with pytest.raises(distmuon.Error, match="state is made at the first step"):
            opt.state_dict()
        m.to_empty(device="cpu")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    torch.manual_seed(2)
    ref = torch.nn.Linear(12, 8)
    with torch.no_grad():
        m.weight.copy_(ref.weight)
        m.bias.copy_(ref.bias)
    ref_opt = dmt.Muon(ref.parameters(), lr=0.02, adamw_lr=0.01)
    for s in range(2):
        x = torch.randn(4, 12, generator=torch.Generator().manual_seed(s))
        for model, o in ((m, opt), (ref, ref_opt)):
            o.zero_grad()
            model(x).square().sum().backward()
            o.step()
    assert torch.equal(m.weight, ref.weight) and torch.equal(m.bias, ref.bias)
    assert torch.equal(opt.state[m.weight]["momentum_buffer"],
                       ref_opt.state[ref.weight]["momentum_buffer"])


def test_parameters_left_on_meta_refused_at_the_first_step():
    with torch.device("meta"):
        w = torch.nn.Parameter(torch.empty(4, 4))
    opt = dmt.Muon([w])
    with pytest.raises(distmuon.Error, match="still on the meta device"):
        opt.step()


def test_group_and_option_mistakes_are_said_without_type_prefixes():
    """No KeyError: 'params' from torch's internals, no "'<=' not supported" comparison error, and
    agreed reasons without an exception class in front ("Error: ...")."""
    p = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"a param group needs 'params' \(its parameters\); "
                                         r"it has 'lr'"):
        dmt.Muon([{"lr": 0.1}])
    opt = dmt.Muon([p])
    with pytest.raises(ValueError, match="a param group needs 'params'"):
        opt.add_param_group({"lr": 0.1})
    with pytest.raises(TypeError, match="lr must be a number, got str 'x'"):
        dmt.Muon([p], lr="x")
    with pytest.raises(distmuon.CollectiveError) as info:
        opt.load_state_dict({})
    message = str(info.value)
    assert "not an optimizer state dict" in message, message
    for prefix in ("Error: ", "KeyError", "TypeError: ", "ValueError: "):
        assert prefix not in message, message
