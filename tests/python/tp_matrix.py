"""The tp-mode x communicator x layout matrix (docs/python.md), shared by test_matrix_mpi.py
(mpirun) and test_matrix_torch.py (torchrun).

A family is one kind of communicator for the world and for the TP / GTP / expert groups the
layouts use. For every optimizer (distmuon.Muon, distmuon.torch.Muon) and tp mode, one optimizer
holds one weight of each layout (so owner mode spreads them over owners) and runs STEPS steps;
each shard is then compared with what the C++ tests (tests/optim) promise:
- duplicated: bit-equal to the same optimizer on the full weights in one process (it gathers the
  full matrix and runs the same NS);
- owner: bit-equal to duplicated (the owner gathers the full matrix, runs the same NS, scatters);
- distributed: within 1e-5 relative (Frobenius, per shard) of duplicated: the Gram matrix is
  summed over the group in another order, which changes fp32 rounding only (test_muon_layouts);
- auto: per weight, as the mode it chose;
- blockwise: each shard's own NS, by design: equal to the same optimizer run in one process on
  this rank's shard alone (its non-padding rows).
"""
import numpy as np

import distmuon

STEPS = 3
DIST_TOL = 1e-5
MODES = ("duplicated", "owner", "distributed", "auto", "blockwise")
KINDS = ("distmuon.Muon", "distmuon.torch.Muon")
# Explicit hyper-parameters (the defaults of distmuon.torch.Muon may change).
HYPER = dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)


def layouts(world_size, rank):
    """(name, m, n, tp_dim, tp, gtp, pad, expert) per layout; tp / gtp: group sizes (TP varying
    fastest, as distmuon.process_groups). A size equal to the world means the world group."""
    g = world_size
    return [
        # name, m, n, tp_dim, tp, gtp, pad, expert
        ("tp_rows", 32, 20, 0, g, 1, 0, False),
        # A bucket of equal weights over the world TP group: one per rank, which auto gives to
        # owner mode (each rank runs one whole NS).
        *[(f"tp_rows_owned{k}", 64, 64, 0, g, 1, 0, False) for k in range(g)],
        ("tp_cols", 20, 32, 1, g, 1, 0, False),
        ("gtp_rows", 34, 16, None, 1, g, (-34) % g, False),  # padded at 4 ranks
        ("tp_x_gtp", 21, 24, 1, 2, g // 2, (-21) % (g // 2), False),  # padded at 4 ranks
        ("expert", 36, 12, None, 1, 2, 0, True),  # one expert per pair of ranks
    ]


def _rng_weight(m, n, seed):
    return (np.random.default_rng(seed).standard_normal((m, n)) * 0.1).astype(np.float32)


def _rng_grad(m, n, seed, step):
    return np.random.default_rng(1000 * seed + step).standard_normal((m, n)).astype(np.float32)


class Placement:
    """Where this rank's shard of one layout lies: ranks in the TP and GTP groups, the groups
    (objects of the family), the expert index, and the seed of the full weight."""

    def __init__(self, layout, family, k):
        name, m, n, tp_dim, tp, gtp, pad, expert = layout
        self.name, self.m, self.n, self.tp_dim = name, m, n, tp_dim
        self.pad, self.expert = pad, expert
        self.tp, self.gtp = tp, gtp
        r = family.rank
        self.tp_rank, self.gtp_rank = r % tp, (r // tp) % gtp
        self.expert_rank = r // (tp * gtp) if expert else 0
        self.seed = 10 * k + self.expert_rank  # experts: another weight per expert
        self.tp_group, self.gtp_group = family.groups(tp, gtp)

    def tp_local(self, full):
        if self.tp_dim is None:
            return full
        return np.split(full, self.tp, axis=self.tp_dim)[self.tp_rank]

    def shard(self, full, pad_fill=0.0):
        """This rank's shard: TP split, pad rows of pad_fill, GTP split of the rows."""
        local = self.tp_local(full)
        padded = np.vstack([local, np.full((self.pad, local.shape[1]), pad_fill, np.float32)])
        return np.ascontiguousarray(np.split(padded, self.gtp, axis=0)[self.gtp_rank])

    def real_rows(self):
        """How many rows of this rank's shard are not padding."""
        rows = (self.tp_local(np.empty((self.m, self.n))).shape[0] + self.pad) // self.gtp
        local_rows = rows * self.gtp - self.pad
        return max(0, min(rows, local_rows - self.gtp_rank * rows))

    def weight(self):
        return _rng_weight(self.m, self.n, self.seed)

    def grad(self, step):
        return _rng_grad(self.m, self.n, self.seed, step)


def _new_optimizer(kind, world, mode, params_and_layouts):
    """An optimizer of `kind` over world with the given tp mode; params_and_layouts: (array,
    dict of layout keywords). Returns (optimizer, step(grads) function, shards as arrays)."""
    if kind == "distmuon.Muon":
        opt = distmuon.Muon(world, tp_mode=mode, **HYPER)
        for a, lo in params_and_layouts:
            opt.add_parameter(a, **lo)
        return opt, opt.step, opt.parameters
    import torch

    import distmuon.torch as dmt

    params, lays = [], []
    for a, lo in params_and_layouts:
        params.append(torch.nn.Parameter(torch.from_numpy(a)))  # shares a's memory
        lays.append(dmt.Layout(**lo))
    opt = dmt.Muon([{"params": params, "layouts": lays}], process_group=world, tp_mode=mode,
                   **HYPER)

    def step(grads):
        for p, g in zip(params, grads):
            p.grad = torch.from_numpy(g)
        opt.step()

    return opt, step, opt.plan


def run_sharded(kind, family, mode):
    """STEPS steps on this rank's shard of every layout. Returns (placements, shards, modes)."""
    places = [Placement(lo, family, k) for k, lo in enumerate(layouts(family.size, family.rank))]
    entries = []
    for p in places:
        lo = dict(name=p.name, rows=p.m, cols=p.n)
        if p.tp_dim is not None:
            lo.update(tp_dim=p.tp_dim, tp_group=p.tp_group)
        if p.gtp > 1 or p.expert:
            lo.update(gtp_group=p.gtp_group, pad=p.pad)
        if p.expert:
            lo.update(expert=True, expert_rank=p.expert_rank)
        entries.append((p.shard(p.weight()), lo))
    _, step, plan = _new_optimizer(kind, family.world, mode, entries)
    for s in range(1, STEPS + 1):
        # Gradients of padding rows are garbage: the optimizer must ignore them.
        step([p.shard(p.grad(s), pad_fill=7.0) for p in places])
    return places, [a for a, _ in entries], [info["mode"] for info in plan()]


def run_reference(kind, p, blockwise):
    """The same optimizer in one process (local communicator, duplicated): on the full weight
    (this rank's shard of the result), or blockwise on this rank's shard's real rows alone."""
    local = distmuon.communicator(None)
    rows = p.real_rows()
    if blockwise:
        a = np.ascontiguousarray(p.shard(p.weight())[:rows])
    else:
        a = p.weight()
    if a.shape[0] == 0:
        return a
    lo = dict(name=p.name, rows=a.shape[0], cols=a.shape[1])
    _, step, _ = _new_optimizer(kind, local, "duplicated", [(a, lo)])
    for s in range(1, STEPS + 1):
        g = p.grad(s)
        step([np.ascontiguousarray(p.shard(g)[:rows]) if blockwise else g])
    return a if blockwise else p.shard(a)[:rows]


def _rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


class SplitFamily:
    """Groups made by distmuon.process_groups from a distmuon communicator `world` (its own C++
    splits), the world itself where a group spans every rank."""

    def __init__(self, name, world):
        self.name, self.world = name, world
        self.size, self.rank = world.size, world.rank
        self._cache = {}

    def groups(self, tp, gtp):
        if (tp, gtp) not in self._cache:
            pg = distmuon.process_groups(self.world, tp, gtp)
            self._cache[(tp, gtp)] = (self.world if tp == self.size else pg.tp,
                                      self.world if gtp == self.size else pg.gtp)
        return self._cache[(tp, gtp)]

    def close(self):
        pass


class Checker:
    """Runs the matrix for one family, caching duplicated's results per optimizer kind."""

    def __init__(self, family):
        self.family = family
        self._dup = {}

    def duplicated(self, kind):
        if kind not in self._dup:
            self._dup[kind] = run_sharded(kind, self.family, "duplicated")
        return self._dup[kind]

    def check(self, kind, mode):
        places, shards, modes = run_sharded(kind, self.family, mode)
        _, dup, _ = self.duplicated(kind)
        errors = []
        for p, s, d, chosen in zip(places, shards, dup, modes):
            what = f"{self.family.name} {kind} {mode} {p.name} rank {self.family.rank}"
            rows = p.real_rows()
            if not np.all(s[rows:] == 0):
                errors.append(f"{what}: padding rows not zero")
            if mode == "blockwise":
                if chosen != "blockwise":
                    errors.append(f"{what}: ran {chosen}")
                ref = run_reference(kind, p, blockwise=True)
                if not np.array_equal(s[:rows], ref):
                    errors.append(f"{what}: differs from the shard's own NS by "
                                  f"{_rel(s[:rows], ref):.3g}")
                continue
            if mode != "auto" and chosen != mode:
                errors.append(f"{what}: ran {chosen}")
            if chosen in ("duplicated", "owner"):
                if not np.array_equal(s, d):
                    errors.append(f"{what} ({chosen}): not bit-equal to duplicated "
                                  f"({_rel(s, d):.3g})")
            elif chosen == "distributed":
                if _rel(s, d) > DIST_TOL:
                    errors.append(f"{what}: {_rel(s, d):.3g} from duplicated > {DIST_TOL}")
            else:
                errors.append(f"{what}: unexpected mode {chosen}")
            if mode == "duplicated":
                ref = run_reference(kind, p, blockwise=False)
                if not np.array_equal(s[:rows], ref):
                    errors.append(f"{what}: differs from the one-process full weight by "
                                  f"{_rel(s[:rows], ref):.3g}")
        if mode == "auto" and not {"owner", "distributed"} <= set(modes):
            # The layouts are chosen so that auto runs both (the owned bucket, the rest).
            errors.append(f"{self.family.name} {kind} auto chose {modes}: not both owner and "
                          "distributed")
        return errors, modes
