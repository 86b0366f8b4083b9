"""distmuon.torch.Muon in one process: against an independent Muon written here from the
published algorithm, param groups and schedules, state_dict round trip, refused parameters."""
import copy
import math

import pytest
import torch

import distmuon
import distmuon.torch as dmt

# The published Muon's quintic (Keller Jordan): one tuple every step (distmuon's "simple"), and
# distmuon's default "quintic" schedule of five tuples (src/ns/coefficients.cpp).
PUBLISHED = [(3.4445, -4.7750, 2.0315)]
QUINTIC_SCHEDULE = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377),
                    (3.7418, -5.5913, 2.3037), (2.8769, -3.1427, 1.2046),
                    (2.8366, -3.0525, 1.2012)]


def reference_ns(g, table, steps=5):
    """Quintic Newton-Schulz along the smaller dimension, normalised by the Frobenius norm."""
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / max(float(x.double().norm()), 1e-15)
    for k in range(steps):
        a, b, c = table[k % len(table)]
        A = x @ x.T
        x = a * x + (b * A + c * (A @ A)) @ x
    return x.T if g.shape[0] > g.shape[1] else x


class ReferenceMuon:
    """Momentum mu, Nesterov, decoupled weight decay, quintic NS x 5, scale sqrt(max(m, n))."""

    def __init__(self, params, lr, table, momentum=0.95, weight_decay=0.0):
        self.params, self.lr, self.mu, self.wd = list(params), lr, momentum, weight_decay
        self.table = table
        self.bufs = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self):
        for p, buf in zip(self.params, self.bufs):
            g = p.grad
            p.mul_(1 - self.lr * self.wd)
            buf.mul_(self.mu).add_(g, alpha=1 - self.mu)
            u = g * (1 - self.mu) + buf * self.mu
            o = reference_ns(u, self.table) * math.sqrt(max(p.shape))
            p.add_(o, alpha=-self.lr)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 48, bias=False), torch.nn.ReLU(),
                               torch.nn.Linear(48, 32, bias=False), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4, bias=False))


def data():
    g = torch.Generator().manual_seed(5)
    return torch.randn(128, 16, generator=g), torch.randn(128, 4, generator=g)


def train(model, opt, steps, lr_at=None):
    x, y = data()
    losses = []
    for s in range(steps):
        if lr_at is not None:
            opt.lr = lr_at(s)
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        if hasattr(opt, "zero_grad"):
            opt.zero_grad()
        else:
            for p in model.parameters():
                p.grad = None
        loss.backward()
        opt.step()
    return losses


@pytest.mark.parametrize("coefficients,table", [("simple", PUBLISHED),
                                                ("quintic", QUINTIC_SCHEDULE)])
def test_matches_reference_muon_20_steps(coefficients, table):
    sched = lambda s: 0.01 / (1 + 0.1 * s)  # noqa: E731  a schedule through param_groups
    model = make_model()
    ref_model = copy.deepcopy(model)
    opt = dmt.Muon(model.parameters(), lr=0.01, weight_decay=0.01, coefficients=coefficients,
                   adjust_lr_fn="spectral")
    lr_sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + 0.1 * s))
    x, y = data()
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
        lr_sched.step()
    ref = ReferenceMuon(ref_model.parameters(), lr=0.01, table=table, weight_decay=0.01)
    ref_losses = train(ref_model, ref, 20, lr_at=sched)
    assert losses[-1] < 0.8 * losses[0]  # it trains
    # fp32 rounding only (OpenBLAS vs torch GEMMs, norm in double in both): 1e-5 relative.
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    print(f"{coefficients}: max relative loss difference {worst:.2e} over 20 steps")
    assert worst <= 1e-5, (losses, ref_losses)
    assert [p["mode"] for p in opt.plan()] == ["duplicated"] * 3  # one process: plain NS


def test_updates_parameters_in_place_and_param_groups():
    model = make_model()
    w = [p.data_ptr() for p in model.parameters()]
    params = list(model.parameters())
    frozen = params[2].detach().clone()
    opt = dmt.Muon([{"params": params[:2]}, {"params": params[2:], "lr": 0.0}], lr=0.02)
    x, y = data()
    before = params[0].detach().clone()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    assert [p.data_ptr() for p in model.parameters()] == w
    assert not torch.equal(before, params[0])
    assert torch.equal(frozen, params[2])  # lr 0 in its group


def test_state_dict_round_trip_bit_exact():
    model = make_model(1)
    opt = dmt.Muon(model.parameters(), lr=0.02)
    train(model, opt, 5)
    sd = copy.deepcopy(opt.state_dict())
    model2 = copy.deepcopy(model)
    after = train(model, opt, 5)
    opt2 = dmt.Muon(model2.parameters(), lr=0.02)
    opt2.load_state_dict(sd)
    resumed = train(model2, opt2, 5)
    assert after == resumed
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_checkpoint_round_trip_bit_exact(tmp_path):
    model = make_model(2)
    opt = dmt.Muon(model.parameters(), lr=0.02)
    train(model, opt, 4)
    opt.save(tmp_path / "ckpt")
    model2 = copy.deepcopy(model)
    after = train(model, opt, 3)
    opt2 = dmt.Muon(model2.parameters(), lr=0.02)
    opt2.load(tmp_path / "ckpt")
    assert train(model2, opt2, 3) == after


def test_bias_goes_to_adamw_and_layout_attribute():
    lin = torch.nn.Linear(8, 6)
    lin.weight.distmuon_layout = dmt.Layout(rows=6, cols=8, name="proj")
    opt = dmt.Muon(lin.parameters(), lr=0.02, adamw_lr=0.01)
    info = opt.plan()
    assert info[0]["name"] == "proj" and info[0]["muon"]
    assert not info[1]["muon"]  # 1-D bias: AdamW
    lin(torch.ones(3, 8)).sum().backward()
    b = lin.bias.detach().clone()
    opt.step()
    assert not torch.equal(b, lin.bias)


def test_bad_parameters_refused():
    with pytest.raises(distmuon.Error, match="torch.float64"):
        dmt.Muon([torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))])
    p = torch.nn.Parameter(torch.zeros(6, 4))
    p.distmuon_layout = dmt.Layout(rows=12, cols=4)  # a shard of 12 rows on one rank: wrong
    with pytest.raises(distmuon.Error, match="the local shard is 6x4"):
        dmt.Muon([p])
    q = torch.nn.Parameter(torch.zeros(4, 4))
    opt = dmt.Muon([q])
    q.grad = torch.full((4, 4), float("nan"))
    with pytest.raises(distmuon.Error, match="non-finite"):
        opt.step()


def test_fixed_options_default_to_the_cpp_ones_and_take_plan_and_wisdom(tmp_path):
    # The options torch.optim.Muon has not are MuonOptions' (ns_algorithm standard, plan
    # estimate, tp_mode auto, ...); those it has are its (test_torch_dropin.py).
    p = torch.nn.Parameter(torch.zeros(4, 4))
    opt = dmt.Muon([p])
    got = opt._cores[0][0].options
    cpp = distmuon.Muon().options
    for key in ("ns_algorithm", "plan", "tp_mode", "wisdom", "use_syrk", "gram_restart",
                "cost_model", "profile", "weight_decay_method"):
        assert got[key] == cpp[key], key
    assert got["ns_algorithm"] == "standard" and got["plan"] == "estimate"
    assert got["tp_mode"] == "auto" and got["wisdom"] == ""
    wisdom = tmp_path / "wisdom.json"
    opt = dmt.Muon([p], plan="measure", wisdom=str(wisdom), ns_algorithm="auto")
    o = opt._cores[0][0].options
    assert (o["plan"], o["wisdom"], o["ns_algorithm"]) == ("measure", str(wisdom), "auto")
    p.grad = torch.ones(4, 4)
    opt.step()  # one rank, an unsharded weight: nothing to measure
    assert opt.plan()[0]["mode"] == "duplicated"
    with pytest.raises(distmuon.Error, match="plan"):
        dmt.Muon([p], plan="guess")
    with pytest.raises(distmuon.Error, match="wisdom"):
        dmt.Muon([p], wisdom=str(wisdom))  # wisdom without plan=measure


def test_a_non_finite_gradient_of_a_later_group_stops_every_group():
    # Group 0's C++ step checks its own gradients; the later groups' are checked before it, all
    # in one pass, so that no group steps when any gradient is not finite.
    a, b, c = (torch.nn.Parameter(torch.randn(4, 4)) for _ in range(3))
    opt = dmt.Muon([{"params": [a]}, {"params": [b, c]}])
    for p in (a, b, c):
        p.grad = torch.ones(4, 4)
    c.grad[2, 1] = float("inf")
    before = [p.detach().clone() for p in (a, b, c)]
    with pytest.raises(distmuon.Error, match="parameter 1 of group 1 has a non-finite value"):
        opt.step()
    assert all(torch.equal(x, p) for x, p in zip(before, (a, b, c)))
    c.grad[2, 1] = 0.0
    opt.step()
    assert not any(torch.equal(x, p) for x, p in zip(before, (a, b, c)))


def test_the_later_groups_finiteness_is_one_reduction_read_once():
    # Device tensors are reduced where they lie and read in one transfer; the first non-finite
    # gradient, in the groups' order, is the one named (CPU tensors take the device path here).
    from distmuon.torch import _first_nonfinite

    ok, bad = torch.zeros(3, 3), torch.zeros(3, 3)
    bad[1, 1] = float("nan")
    checks = [("first", [ok, ok.numpy()]), ("second", [ok, bad]), ("third", [bad.numpy()])]
    assert _first_nonfinite(checks) == "second"
    assert _first_nonfinite(checks[2:]) == "third"
    assert _first_nonfinite(checks[:1]) is None and _first_nonfinite([]) is None
