"""distmuon.torch.Muon's log lines through Python's logging (docs/python.md, "Logging"), under
torchrun at 2 processes (tp_mode=auto chooses, and logs, only for a weight split over ranks):
the choices arrive as INFO records of the "distmuon" logger on rank 0 alone, nothing is printed
on stdout, and a logger level of WARNING silences them.
"""
import logging

import pytest
import torch
import torch.distributed as dist

import distmuon.torch as dmt


pytestmark = pytest.mark.usefixtures("gloo")


def _step(rows):
    """One step of a weight split by rows over the 2 processes, tp_mode auto."""
    torch.manual_seed(rows)
    w = torch.nn.Parameter(torch.randn(rows // 2, 16))
    layout = dmt.Layout(rows=rows, cols=16, tp_dim=0, tp_group="world")
    opt = dmt.Muon([{"params": [w], "layouts": [layout]}], tp_mode="auto")
    w.grad = torch.randn(rows // 2, 16)
    opt.step()


def test_auto_lines_go_to_the_distmuon_logger(caplog, capfd):
    with caplog.at_level(logging.INFO, logger="distmuon"):
        _step(24)
    lines = [r.getMessage() for r in caplog.records
             if r.name == "distmuon" and r.levelno == logging.INFO]
    if dist.get_rank() == 0:
        assert any(line.startswith("tp_mode=auto") for line in lines), lines
    else:
        assert lines == []
    assert "tp_mode=auto" not in capfd.readouterr().out
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="distmuon"):
        _step(40)  # a new shape: auto decides (and would log) again
    assert not [r for r in caplog.records if r.name == "distmuon"]
    assert "tp_mode=auto" not in capfd.readouterr().out
