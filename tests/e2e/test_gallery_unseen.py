"""The doctor's held-out ``unseen`` models (tests/gallery_unseen.py) are real workloads: each trains through
``lab.run`` by name and learns its task well above chance, so a doctor score on them is a score on a model
that works, not on one that is broken. No timing assertions."""

from __future__ import annotations

import pytest
import torch
from gallery_unseen import UNSEEN, LSTMCellLoop, register_unseen

from lab import RunConfig, run

#: (chance, a floor well under what 3 tiny epochs reach here) per model
LEARNS = {"unseen_lstmcell": (0.25, 0.45), "unseen_conv1d": (0.25, 0.6), "unseen_moe": (0.25, 0.45),
          "unseen_widedeep": (0.5, 0.65)}


@pytest.fixture(scope="module", autouse=True)
def unseen_workloads():
    return register_unseen()


def test_every_unseen_model_has_a_learning_floor() -> None:
    assert set(LEARNS) == set(UNSEEN)


@pytest.mark.parametrize("name", sorted(UNSEEN))
def test_unseen_model_trains_and_learns(name: str) -> None:
    r = run(RunConfig(workload=name, size="tiny", threads=1, latency_repeats=2))
    chance, floor = LEARNS[name]
    assert r.workload == name and r.param_count > 0
    assert r.metric_name == "accuracy" and r.metric > floor > chance, (name, r.metric)


def test_the_lstmcell_model_is_a_python_loop_of_cells() -> None:
    """Its point in the set is one cell call per time step (not one fused ``aten::lstm``): check the ops."""
    model = LSTMCellLoop()
    x = torch.randn(3, 16, 8)
    with torch.profiler.profile() as prof:
        model(x)
    names = [e.key for e in prof.key_averages()]
    calls = {e.key: e.count for e in prof.key_averages()}
    assert "aten::lstm" not in names
    assert calls.get("aten::lstm_cell", 0) >= 16 or calls.get("aten::_thnn_fused_lstm_cell", 0) >= 16 \
        or calls.get("aten::addmm", 0) >= 16, calls
