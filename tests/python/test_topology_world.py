"""tp_mode auto's NVLink-domain topology over a torch.distributed (gloo) world, 2 or more processes:
under torchrun, and under mpirun with MPI never initialised (mpi4py not imported). Each process
probes its domain with its rank in the optimizer's world: with a DISTMUON_TOPOLOGY_FILE giving
ranks below WORLD / 2 domain "A" and the others "B", the group of every rank crosses a domain
(each process reads its own entry); with one domain for all, it does not.
"""
import os
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist

import distmuon.torch as dmt

_MPIRUN = "OMPI_COMM_WORLD_RANK" in os.environ and "TORCHELASTIC_RUN_ID" not in os.environ
if not dist.is_initialized():
    if _MPIRUN:
        # gloo over a file store named by the mpirun job: no MPI, no port to agree on.
        store = os.path.join(tempfile.gettempdir(),
                             f"distmuon-topology-world-{os.environ['OMPI_MCA_ess_base_jobid']}")
        dist.init_process_group("gloo", init_method=f"file://{store}",
                                rank=int(os.environ["OMPI_COMM_WORLD_RANK"]),
                                world_size=int(os.environ["OMPI_COMM_WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo")  # torchrun's environment
torch.set_num_threads(1)
WORLD, RANK = dist.get_world_size(), dist.get_rank()
if WORLD < 2:
    pytest.skip("needs 2 or more processes", allow_module_level=True)

H, D = 32, 8


@pytest.fixture
def topology_file(tmp_path, monkeypatch):
    """Writes this process's topology file ({rank: domain}) and points DISTMUON_TOPOLOGY_FILE to
    it (the probe reads it when the optimizer plans)."""
    import json

    def write(domain_of):
        path = tmp_path / f"topology-{RANK}.json"
        path.write_text(json.dumps(
            {"ranks": [{"rank": r, "domain": domain_of(r)} for r in range(WORLD)]}))
        monkeypatch.setenv("DISTMUON_TOPOLOGY_FILE", str(path))
    return write


def _plan():
    """One auto step of two weights sharded over the world: one over the optimizer's world
    ("world"), one over a torch process group of the same ranks (its ranks in the world come from
    its placement)."""
    g = torch.Generator().manual_seed(5)
    w1, w2 = torch.randn(H, D, generator=g), torch.randn(D, H, generator=g)
    p1 = torch.nn.Parameter(w1.chunk(WORLD, 0)[RANK].contiguous())
    p2 = torch.nn.Parameter(w2.chunk(WORLD, 1)[RANK].contiguous())
    layouts = [dmt.Layout(rows=H, cols=D, tp_dim=0, tp_group="world", name="w1"),
               dmt.Layout(rows=D, cols=H, tp_dim=1, tp_group=dist.new_group(list(range(WORLD))),
                          name="w2")]
    opt = dmt.Muon([{"params": [p1, p2], "layouts": layouts}], lr=0.02, tp_mode="auto")
    p1.grad, p2.grad = torch.ones_like(p1), torch.ones_like(p2)
    opt.step()
    assert torch.isfinite(p1).all() and torch.isfinite(p2).all()
    return opt.plan()


def test_each_rank_reads_its_own_entry(topology_file):
    topology_file(lambda r: "A" if r < WORLD // 2 else "B")
    plan = _plan()
    assert [p["crosses_domain"] for p in plan] == [True, True], plan
    if _MPIRUN:
        assert "mpi4py" not in sys.modules  # MPI was never initialised in this process


def test_one_domain_does_not_cross(topology_file):
    topology_file(lambda r: "A")
    plan = _plan()
    assert [p["crosses_domain"] for p in plan] == [False, False], plan
