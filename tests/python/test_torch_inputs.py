"""Inputs torch.optim.Muon takes, in distmuon.torch.Muon (docs/python.md, "What differs from
torch.optim.Muon"): each works, equal to the computation on the contiguous parameter (bit-equal:
the same arithmetic on the same values) or to torch.optim.Muon, or is refused with its reason.
"""
import pytest
import torch

import distmuon.torch as dmt


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
