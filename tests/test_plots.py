"""Plot functions return figures whose traces carry the results' numbers."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly")

from lab.plots import loss_curves, phase_breakdown  # noqa: E402
from lab.result import RunResult  # noqa: E402


def _result(run_id: str, forward: float, wait: float) -> RunResult:
    n = 6
    samples = {"data_wait": [wait] * n, "forward": [forward] * n, "backward": [1.0] * n, "optimizer": [0.5] * n,
               "comm": [0.0] * n, "total": [wait + forward + 1.5 + 0.25] * n}
    return RunResult(run_id=run_id, config={"size": "tiny", "seed": 0}, env={}, workload="ctr", steps=n,
                     warmup_steps=1, batch_size=8, step_times_ms=samples, losses=[1.0, 0.5, 0.25])


def test_phase_breakdown_stacks_phases_and_other():
    fig = phase_breakdown([_result("a" * 32, 2.0, 0.5), _result("b" * 32, 4.0, 0.0)], labels=["A", "B"])
    names = [t.name for t in fig.data]
    assert names == ["data_wait", "forward", "backward", "optimizer", "other"]  # comm is all zero: no trace
    forward = fig.data[1]
    assert list(forward.x) == [2.0, 4.0] and list(forward.y) == ["A", "B"]
    assert list(fig.data[-1].x) == pytest.approx([0.25, 0.25])


def test_loss_curves_one_line_per_run():
    fig = loss_curves([_result("a" * 32, 1, 0), _result("b" * 32, 1, 0)])
    assert len(fig.data) == 2 and list(fig.data[0].y) == [1.0, 0.5, 0.25]
