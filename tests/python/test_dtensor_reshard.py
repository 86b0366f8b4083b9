"""torch.distributed.checkpoint across process counts: one torchrun saves the model and
distmuon.torch.Muon's state (FSDP2 x TP on a 2 x 2 mesh at 4 processes, or FSDP2 at 2), another
with a different number of processes loads them into a model sharded otherwise. The loaded state
equals the saved one exactly, and 5 more steps match the unsharded model trained 10 steps
(test_dtensor.RTOL). DISTMUON_DCP_PHASE (save | load) and DISTMUON_DCP_DIR say which and where.
"""
import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import test_dtensor as t


def test_phase():
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.set_num_threads(1)
    phase, path = os.environ["DISTMUON_DCP_PHASE"], os.environ["DISTMUON_DCP_DIR"]
    t._hidden = lambda: 10  # the same model at both process counts (even over the 2 x 2 mesh)
    world = dist.get_world_size()
    kind = "2d" if world >= 4 else "fsdp"
    net = t._sharded(kind, world)
    opt = t._optimizer(net.parameters(), "distributed")
    expected = os.path.join(path, "expected_state.pt")
    if phase == "save":
        if dist.get_rank() == 0:  # a fresh directory: nothing of an earlier run is loaded
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
        dist.barrier()
        t._train(net, opt, 5)
        dcp.save({"model": net.state_dict(), "optim": opt.state_dict()},
                 checkpoint_id=os.path.join(path, "dcp"))
        state = t._full_state(opt)
        if dist.get_rank() == 0:
            torch.save(state, expected)
        dist.barrier()
        assert os.path.exists(expected)
        return
    sd = {"model": net.state_dict(), "optim": opt.state_dict()}
    dcp.load(sd, checkpoint_id=os.path.join(path, "dcp"))
    net.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])
    saved, loaded = torch.load(expected), t._full_state(opt)
    assert saved.keys() == loaded.keys() and len(saved) == 7  # the 7 parameters
    for k in saved:
        assert saved[k].keys() == loaded[k].keys()
        for n in saved[k]:
            assert torch.equal(saved[k][n], loaded[k][n]), (k, n)
    t._train(net, opt, 5, first=5)
    rel = t._max_rel(net, t._reference(10))
    if dist.get_rank() == 0:
        print(f"\nsaved at another process count, loaded as {kind} at {world}: 5 more steps "
              f"within {rel:.2e} of the unsharded run")
    assert rel <= t.RTOL, rel
