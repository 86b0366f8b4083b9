"""distmuon.torch.Muon as a drop-in for torch.optim.Muon (one process): side by side with
torch's own optimizer on the same weights and the same gradients, its defaults, per-group
hyper-parameters read at every step, parameters without a gradient, low-precision, 3-D and 4-D
parameters, AdamW under LR schedulers, and load_state_dict's checks."""
import copy

import numpy as np
import pytest
import torch
import torch.optim._muon as torch_muon

import distmuon
import distmuon.torch as dmt
from torch_reference import fp32_zeropower

SHAPES = [(48, 16), (32, 48), (64, 64), (8, 40)]  # tall, wide, square, very wide


@pytest.fixture
def fp32_torch_ns(monkeypatch):
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", fp32_zeropower)


def _weights(seed=0, shapes=SHAPES, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(s, generator=g) / s[1] ** 0.5).to(dtype))
            for s in shapes]


def _grads(step, params, seed=1):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return [torch.randn(p.shape, generator=g).to(p.dtype) for p in params]


def _side_by_side(steps, torch_kwargs, ours_kwargs=None, schedule=None, missing=None):
    """Both optimizers on copies of the same weights, fed the same gradients; schedule(step,
    group) edits both optimizers' group 0 before a step; missing(step) -> indices without a
    gradient. Returns the worst relative difference of any weight after each step."""
    a = _weights()
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    ta = torch.optim.Muon(a, **torch_kwargs)
    tb = dmt.Muon(b, **(ours_kwargs or torch_kwargs))
    worst = []
    for s in range(steps):
        if schedule:
            schedule(s, ta.param_groups[0])
            schedule(s, tb.param_groups[0])
        skip = missing(s) if missing else ()
        for k, (g, p, q) in enumerate(zip(_grads(s, a), a, b)):
            p.grad = None if k in skip else g.clone()
            q.grad = None if k in skip else g.clone()
        ta.step()
        tb.step()
        worst.append(max(float((p - q).norm() / p.norm()) for p, q in
                          zip(map(torch.Tensor.detach, a), map(torch.Tensor.detach, b))))
    return worst, a, b


@pytest.mark.parametrize("kwargs", [
    dict(),                                                       # torch's defaults
    dict(lr=0.02, weight_decay=0.01, adjust_lr_fn="match_rms_adamw"),
    dict(lr=0.01, momentum=0.9, nesterov=False, ns_steps=6, eps=1e-5, weight_decay=0.0,
         ns_coefficients=(2.8, -3.0, 1.2), adjust_lr_fn="original"),
])
def test_matches_torch_muon_with_fp32_ns(fp32_torch_ns, kwargs):
    worst, _, _ = _side_by_side(20, kwargs)
    # fp32 rounding only (OpenBLAS against torch's GEMMs, distmuon's norm in double, the tall
    # matrices iterated without a transpose): measured 3.8e-8, 2.3e-7 and 8.8e-8 over 20 steps.
    print(f"{kwargs}: worst relative weight difference {max(worst):.2e}")
    assert max(worst) <= 1e-5


def test_matches_torch_muon_with_its_bf16_ns():
    # torch's own NS runs in bfloat16 (8 bits of mantissa): its updates differ from fp32 NS by
    # about 1% of the update. The weights' difference grows with the steps taken, relative to
    # the weights: at lr 0.02 over 20 steps measured 1.3e-3 (the test allows 1e-2); compared as
    # the difference of the total updates (w20 - w0) 5.5e-3 (allowed 3e-2).
    w0 = [p.detach().clone() for p in _weights()]
    worst, a, b = _side_by_side(20, dict(lr=0.02))
    upd = max(float(((p - w) - (q - w)).norm() / (p - w).norm()) for p, q, w in zip(a, b, w0))
    print(f"bf16 NS: worst relative weight difference {max(worst):.2e}, of the updates "
          f"{upd:.2e}")
    assert max(worst) <= 1e-2 and upd <= 3e-2
    assert upd > 1e-4  # torch's bf16 NS is really in use (fp32 agrees to ~1e-6)


@pytest.mark.parametrize("shape", [(256, 256), (1024, 256), (256, 1024), (1024, 4096)])
def test_default_step_has_torch_default_size(shape):
    # One default step of each from the same weights and gradient: the update norms agree
    # within bf16's effect on torch's NS (measured ratios 0.9994 to 1.0000; allowed 3%).
    a = _weights(3, [shape])
    b = [torch.nn.Parameter(a[0].detach().clone())]
    ta, tb = torch.optim.Muon(a), dmt.Muon(b)
    w0 = a[0].detach().clone()
    a[0].grad = _grads(0, a)[0]
    b[0].grad = a[0].grad.clone()
    ta.step()
    tb.step()
    ratio = float((b[0] - w0).norm() / (a[0] - w0).norm())
    print(f"{shape}: distmuon/torch default step size {ratio:.4f}")
    assert abs(ratio - 1) <= 0.03


def test_every_group_key_is_read_at_every_step(fp32_torch_ns):
    def schedule(s, group):
        group["lr"] = 0.02 / (1 + s)
        group["momentum"] = 0.95 if s < 5 else 0.5
        group["nesterov"] = s < 8
        group["weight_decay"] = 0.1 if s < 10 else 0.0
        group["ns_steps"] = 5 if s < 12 else (4 if s < 16 else 6)
        group["eps"] = 1e-7 if s < 14 else 1e-3
        group["ns_coefficients"] = (3.4445, -4.7750, 2.0315) if s < 16 else (2.8, -3.0, 1.2)
        group["adjust_lr_fn"] = None if s < 18 else "match_rms_adamw"

    worst, _, _ = _side_by_side(20, dict(), schedule=schedule)
    print(f"scheduled keys: worst relative weight difference {max(worst):.2e}")
    assert max(worst) <= 1e-5
    # The schedule does change the run: without it the weights end elsewhere.
    plain, _, _ = _side_by_side(20, dict())
    assert plain != worst


def test_parameters_without_gradient_are_skipped_as_torch_does(fp32_torch_ns):
    worst, a, b = _side_by_side(10, dict(lr=0.02), missing=lambda s: {1} if s >= 4 else {})
    assert max(worst) <= 1e-5
    # Without a gradient neither the weight nor its momentum moves (weight decay included).
    a2 = _weights()
    opt = dmt.Muon(a2, lr=0.02)
    for p, g in zip(a2, _grads(0, a2)):
        p.grad = g
    opt.step()
    before = copy.deepcopy(opt.state_dict())
    w1 = a2[1].detach().clone()
    a2[1].grad = None
    opt.step()
    after = opt.state_dict()
    assert torch.equal(w1, a2[1])
    assert torch.equal(before["state"][1]["momentum_buffer"], after["state"][1]["momentum_buffer"])
    assert not torch.equal(before["state"][0]["momentum_buffer"],
                           after["state"][0]["momentum_buffer"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_parameters(dtype):
    # Each step equals a float32 step from the same (upcast) weight, rounded to the parameter's
    # dtype: bit for bit. The state is float32.
    low = _weights(4, SHAPES[:2], dtype)
    ref = [torch.nn.Parameter(p.detach().float()) for p in low]
    o_low, o_ref = dmt.Muon(low, lr=0.02), dmt.Muon(ref, lr=0.02)
    for s in range(3):
        for p, q, g in zip(low, ref, _grads(s, ref)):
            q.data.copy_(p.detach().float())
            p.grad, q.grad = g.to(dtype), g.to(dtype).float()
        o_low.step()
        o_ref.step()
        for p, q in zip(low, ref):
            assert p.dtype == dtype
            assert torch.equal(p, q.to(dtype))
    st = o_low.state_dict()["state"][0]["momentum_buffer"]
    assert st.dtype == torch.float32 and st.shape == low[0].shape


def test_bf16_parameters_are_stepped_where_they_lie():
    # No float32 copy of a bfloat16 parameter is kept (the C++ optimizer makes one for each step
    # only): odd element counts, a 3-D batch and 1-D (AdamW) and 4-D parameters, each step bit
    # for bit the float32 step of the same values rounded, as test_low_precision_parameters.
    g = torch.Generator().manual_seed(3)
    shapes = [(5, 7), (2, 3, 5), (9,), (3, 2, 1, 3)]
    low = [torch.nn.Parameter(torch.randn(s, generator=g).bfloat16()) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().float()) for p in low]
    o_low, o_ref = dmt.Muon(low, lr=0.02), dmt.Muon(ref, lr=0.02)
    assert all(e.work is None for e in o_low._cores[0][1])
    addresses, start = [p.data_ptr() for p in low], [p.detach().clone() for p in low]
    for s in range(3):
        for p, q, grad in zip(low, ref, _grads(s, ref)):
            q.data.copy_(p.detach().float())
            p.grad, q.grad = grad.bfloat16(), grad.bfloat16().float()
        o_low.step()
        o_ref.step()
        for p, q in zip(low, ref):
            assert p.dtype == torch.bfloat16 and torch.equal(p, q.to(torch.bfloat16))
    assert [p.data_ptr() for p in low] == addresses
    assert not any(torch.equal(p, p0) for p, p0 in zip(low, start))  # every one stepped


def test_momentum_in_the_parameters_dtype():
    # momentum_dtype="param": a bfloat16 parameter's momentum is kept in bfloat16, as
    # torch.optim.Muon keeps its momentum_buffer. opt.state[p] views it (bfloat16, p's shape);
    # each step is bit for bit the float32 step whose weights and momentum are rounded to
    # bfloat16 after it; the momentum is torch.optim.Muon's within 2^-7 of its largest element
    # (torch rounds the same sum mu buf + (1 - mu) g, computed as a lerp in another order, so
    # the two differ by a bfloat16 rounding or two of the summands, which an element near zero,
    # where they cancel, does not bound: measured 3.3e-3 of the largest after 3 steps).
    low = _weights(6, SHAPES[:2] + [(3, 16, 24)], torch.bfloat16)
    ref = [torch.nn.Parameter(p.detach().float()) for p in low]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in low[:2]]
    o_low = dmt.Muon(low, lr=0.02, momentum_dtype="param")
    o_ref, o_torch = dmt.Muon(ref, lr=0.02), torch.optim.Muon(theirs, lr=0.02)
    for s in range(3):
        for p, q, g in zip(low, ref, _grads(s, ref)):
            p.grad, q.grad = g.bfloat16(), g.bfloat16().float()
        for p, t in zip(low, theirs):
            t.grad = p.grad.clone()
        o_low.step()
        o_ref.step()
        o_torch.step()
        for p, q in zip(low, ref):  # the reference as bfloat16 stores it
            q.data.copy_(q.detach().bfloat16().float())
            buf = o_ref.state[q]["momentum_buffer"]  # a view: rounding it rounds the state
            buf.copy_(buf.bfloat16().float())
        for p, q in zip(low, ref):
            assert torch.equal(p, q.bfloat16())
            assert torch.equal(o_low.state[p]["momentum_buffer"].float(),
                               o_ref.state[q]["momentum_buffer"])
    for p, t in zip(low, theirs):
        ours, want = o_low.state[p]["momentum_buffer"], o_torch.state[t]["momentum_buffer"]
        assert ours.dtype == want.dtype == torch.bfloat16 and ours.shape == want.shape
        assert float((ours.float() - want.float()).abs().max()) <= \
            2**-7 * float(want.float().abs().max())
    # A state_dict holds it in bfloat16 and round-trips to a bit-equal next step.
    sd = o_low.state_dict()
    assert sd["state"][0]["momentum_buffer"].dtype == torch.bfloat16
    copies = [torch.nn.Parameter(p.detach().clone()) for p in low]
    o_copy = dmt.Muon(copies, lr=0.02, momentum_dtype="param")
    o_copy.load_state_dict(sd)
    for p, c, g in zip(low, copies, _grads(9, ref)):
        p.grad, c.grad = g.bfloat16(), g.bfloat16()
    o_low.step()
    o_copy.step()
    assert all(torch.equal(p, c) for p, c in zip(low, copies))


def test_3d_parameter_is_a_batch_of_matrices():
    batch = torch.nn.Parameter(_weights(5, [(3, 16, 24)])[0].detach())
    slices = [torch.nn.Parameter(batch.detach()[e].clone()) for e in range(3)]
    ob, os_ = dmt.Muon([batch], lr=0.02), dmt.Muon(slices, lr=0.02)
    for s in range(3):
        g = _grads(s, [batch])[0]
        batch.grad = g
        for e, p in enumerate(slices):
            p.grad = g[e].clone()
        ob.step()
        os_.step()
    for e in range(3):
        assert torch.equal(batch[e], slices[e])  # each slice orthogonalised on its own
    # One C++ parameter: a batch of 3 matrices of 16 x 24.
    assert [(i["rows"], i["cols"], i["batch"]) for i in ob.plan()] == [(16, 24, 3)]
    st = ob.state_dict()["state"][0]["momentum_buffer"]
    assert st.shape == (3, 16, 24)
    assert torch.equal(st[2], os_.state_dict()["state"][2]["momentum_buffer"])
    live = ob.state[batch]["momentum_buffer"]  # a view of the C++ state, shaped like the batch
    assert live.shape == (3, 16, 24) and torch.equal(live, st)


def test_3d_parameter_of_no_matrices_is_left_alone():
    """A batch of 0 matrices holds nothing to update: it is not registered, the weight beside it
    steps bit for bit as without it, and its state is empty and round-trips."""
    w = _weights(8, [(16, 24)])[0]
    alone = torch.nn.Parameter(w.detach().clone())
    empty = torch.nn.Parameter(torch.zeros(0, 16, 24))
    opt, ref = dmt.Muon([w, empty], lr=0.02), dmt.Muon([alone], lr=0.02)
    for s in range(2):
        g = _grads(s, [w])[0]
        w.grad, alone.grad, empty.grad = g.clone(), g.clone(), torch.zeros(0, 16, 24)
        opt.step()
        ref.step()
    assert torch.equal(w, alone)
    assert [(i["rows"], i["cols"], i["batch"]) for i in opt.plan()] == [(16, 24, 1)]
    sd = opt.state_dict()
    kept = {k: tuple(t.shape) for k, t in sd["state"][1].items() if k != "step"}
    assert kept and all(shape == (0, 16, 24) for shape in kept.values())
    opt.load_state_dict(sd)
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"],
                       sd["state"][0]["momentum_buffer"])


def test_expert_tp_mode_applies_to_expert_layouts():
    experts = torch.nn.Parameter(_weights(6, [(4, 8, 12)])[0].detach())
    dense = torch.nn.Parameter(_weights(7, [(8, 12)])[0].detach())
    experts.distmuon_layout = dmt.Layout(rows=8, cols=12, expert=True)
    opt = dmt.Muon([experts, dense], tp_mode="duplicated", expert_tp_mode="owner")
    experts.grad, dense.grad = _grads(0, [experts, dense])
    opt.step()
    assert [(i["mode"], i["batch"]) for i in opt.plan()] == [("owner", 4), ("duplicated", 1)]


def test_core_takes_a_3d_shard_as_one_batch():
    """distmuon.Muon: a 3-D array is one parameter of a batch, bit-equal to its slices apart."""
    rng = np.random.default_rng(3)
    batch = rng.standard_normal((3, 6, 10)).astype(np.float32)
    slices = [batch[e].copy() for e in range(3)]
    ob, os_ = distmuon.Muon(tp_mode="duplicated"), distmuon.Muon(tp_mode="duplicated")
    ob.add_parameter(batch, "experts")
    for e, w in enumerate(slices):
        os_.add_parameter(w, f"experts{e}")
    for _ in range(2):
        g = rng.standard_normal(batch.shape).astype(np.float32)
        ob.step([g])
        os_.step([g[e].copy() for e in range(3)])
    for e in range(3):
        assert np.array_equal(batch[e], slices[e])
    assert [(i["rows"], i["cols"], i["batch"]) for i in ob.parameters()] == [(6, 10, 3)]


def test_conv_weight_is_flattened():
    conv = torch.nn.Conv2d(4, 8, 3, bias=False)
    flat = torch.nn.Parameter(conv.weight.detach().reshape(8, -1).clone())
    oc, of = dmt.Muon([conv.weight], lr=0.02), dmt.Muon([flat], lr=0.02)
    for s in range(3):
        g = _grads(s, [conv.weight])[0]
        conv.weight.grad, flat.grad = g, g.reshape(8, -1).clone()
        oc.step()
        of.step()
    assert torch.equal(conv.weight.detach().reshape(8, -1), flat)
    assert (oc.plan()[0]["rows"], oc.plan()[0]["cols"]) == (8, 36)
    assert oc.state_dict()["state"][0]["momentum_buffer"].shape == conv.weight.shape


def test_newton_schulz_on_a_3d_batch():
    x = torch.randn(4, 12, 20)
    out = distmuon.newton_schulz(x)
    assert isinstance(out, torch.Tensor) and out.shape == x.shape
    for e in range(4):
        assert torch.equal(out[e], distmuon.newton_schulz(x[e].contiguous()))
    buf = np.empty((4, 12, 20), dtype=np.float32)
    distmuon.newton_schulz(x.numpy(), out=buf)
    assert np.array_equal(buf, out.numpy())
    with pytest.raises(distmuon.Error, match="output"):
        distmuon.newton_schulz(x.numpy(), out=np.empty((3, 12, 20), dtype=np.float32))


def _adamw_pair(make_sched, adamw_lr=0.01, torch_lr=None):
    """A bias trained by distmuon's AdamW and by torch.optim.AdamW (same betas, eps, no weight
    decay), each under its scheduler; returns the worst relative difference."""
    w = torch.nn.Parameter(torch.randn(8, 8))
    b1 = torch.nn.Parameter(torch.randn(8))
    b2 = torch.nn.Parameter(b1.detach().clone())
    ours = dmt.Muon([w, b1], lr=0.02, adamw_lr=adamw_lr)
    ref = torch.optim.AdamW([b2], lr=torch_lr or adamw_lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0)
    s_ours, s_ref = make_sched(ours), make_sched(ref)
    worst = 0.0
    for s in range(12):
        g = torch.randn(8, generator=torch.Generator().manual_seed(s))
        w.grad, b1.grad, b2.grad = torch.randn(8, 8), g.clone(), g.clone()
        ours.step()
        ref.step()
        s_ours.step()
        s_ref.step()
        worst = max(worst, float((b1 - b2).norm() / b2.norm()))
    return worst, ours


def test_lr_schedulers_move_adamw_parameters():
    lam = lambda s: 1.0 / (1 + s)  # noqa: E731
    worst, ours = _adamw_pair(lambda o: torch.optim.lr_scheduler.LambdaLR(o, lam))
    assert worst <= 1e-6  # fp32 elementwise rounding only
    g = ours.param_groups[0]
    assert g["lr"] == pytest.approx(0.02 / 13) and g["initial_lr"] == 0.02
    # OneCycleLR: AdamW follows lr / initial_lr, as torch's AdamW under OneCycleLR whose
    # max_lr is adamw_lr x div_factor (both start at their initial rate). Its momentum cycling
    # moves Muon's momentum here (as on torch.optim.Muon), AdamW's beta1 there: left out.
    worst, _ = _adamw_pair(
        lambda o: torch.optim.lr_scheduler.OneCycleLR(
            o, max_lr=25 * o.param_groups[0]["lr"], total_steps=20, cycle_momentum=False))
    assert worst <= 1e-6
    # Without the factor the bias would train at a constant rate: the comparison sees it.
    const, _ = _adamw_pair(lambda o: torch.optim.lr_scheduler.LambdaLR(
        o, lam if isinstance(o, torch.optim.AdamW) else (lambda s: 1.0)))
    assert const > 1e-3


def test_lr_zero_freezes_adamw_parameters_and_state_has_their_shape():
    lin = torch.nn.Linear(6, 4)
    opt = dmt.Muon([{"params": [lin.weight]}, {"params": [lin.bias], "lr": 0.0}])
    lin(torch.ones(2, 6)).sum().backward()
    b = lin.bias.detach().clone()
    opt.step()
    assert torch.equal(b, lin.bias)
    st = opt.state_dict()["state"][1]
    assert st["exp_avg"].shape == (4,) and st["exp_avg_sq"].shape == (4,)
    opt.param_groups[1]["lr"] = 1e-3  # initial_lr 0: AdamW at adamw_lr
    opt.step()
    assert not torch.equal(b, lin.bias)


def _trained(seed=6, steps=3, sched=True):
    lin = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Linear(12, 3))
    torch.manual_seed(seed)
    opt = dmt.Muon(lin.parameters(), lr=0.02, adamw_lr=0.01)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s) if sched else None
    x = torch.randn(16, 6)
    for _ in range(steps):
        opt.zero_grad()
        lin(x).square().mean().backward()
        opt.step()
        if sch:
            sch.step()
    return lin, opt, sch, x


def test_state_dict_round_trips_scheduled_rates_bit_exact():
    lin, opt, sch, x = _trained()
    sd, ssd = copy.deepcopy(opt.state_dict()), copy.deepcopy(sch.state_dict())
    lin2 = copy.deepcopy(lin)
    opt2 = dmt.Muon(lin2.parameters(), lr=0.5, adamw_lr=0.5)
    sch2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 0.5 ** s)
    opt2.load_state_dict(sd)
    sch2.load_state_dict(ssd)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.02 * 0.5 ** 3
    for m, o, s in ((lin, opt, sch), (lin2, opt2, sch2)):
        for _ in range(3):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
            s.step()
    for p, q in zip(lin.parameters(), lin2.parameters()):
        assert torch.equal(p, q)


def _corrupt(sd, fn):
    sd = copy.deepcopy(sd)
    fn(sd)
    return sd


@pytest.mark.parametrize("corrupt,message", [
    (lambda sd: sd["state"][2].__setitem__("momentum_buffer", torch.zeros(3, 3)), r"is \(3, 3\)"),
    (lambda sd: sd["state"][1]["exp_avg"].__setitem__(0, float("nan")), "non-finite"),
    (lambda sd: sd["state"][3]["exp_avg_sq"].__setitem__(0, -1.0), "negative"),
    (lambda sd: sd["state"][3].pop("exp_avg"), "no 'exp_avg'"),
    (lambda sd: sd["state"][0].__setitem__("step", torch.tensor(1.5)), "whole number"),
    (lambda sd: sd["param_groups"][0].__setitem__("momentum", 1.5), "momentum"),
    (lambda sd: sd["param_groups"][0].pop("adamw_lr"), "not a state of distmuon"),
    (lambda sd: sd["param_groups"][0]["params"].pop(), "3 parameters in the state"),
    (lambda sd: sd["state"].pop(2), "no state for parameter 2"),
])
def test_load_state_dict_refuses_and_changes_nothing(corrupt, message):
    lin, opt, _, _ = _trained(sched=False)
    good = copy.deepcopy(opt.state_dict())
    opt.param_groups[0]["lr"] = 0.003
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(distmuon.Error, match=message):
        opt.load_state_dict(_corrupt(good, corrupt))
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for k in before["state"]:
        for key, t in before["state"][k].items():
            assert torch.equal(t, after["state"][k][key])


def test_load_state_dict_refuses_other_optimizers_clearly():
    lin, opt, _, _ = _trained(sched=False)
    tm = torch.optim.Muon([lin[0].weight, lin[1].weight])
    lin(torch.ones(2, 6)).sum().backward()
    tm.step()
    with pytest.raises(distmuon.Error, match="not a state of distmuon.torch.Muon"):
        opt.load_state_dict(tm.state_dict())
    with pytest.raises(distmuon.Error, match="not an optimizer state dict"):
        opt.load_state_dict({"momentum_buffer": 1})


def test_torch_argument_checks_and_options():
    p = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="not supported"):
        dmt.Muon([p], adjust_lr_fn="bogus")
    with pytest.raises(ValueError, match=">= 0"):
        dmt.Muon([p], lr=-1.0)
    with pytest.raises(ValueError, match="C\\+\\+ option name"):
        dmt.Muon([p], steps=3)
    opt = dmt.Muon([p], coefficients="polar_express", tp_mode="duplicated")
    assert opt._cores[0][0].options["coefficients"] == "polar_express"
    o = dmt.Muon([p])._cores[0][0].options
    assert (o["lr"], o["weight_decay"], o["momentum"], o["nesterov"], o["eps"], o["steps"],
            o["scale_mode"], o["coefficients"], o["custom_coefficients"]) == \
        (1e-3, 0.1, 0.95, True, 1e-7, 5, "shape_scaling", "custom", "3.4445,-4.775,2.0315")
