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


def _ablation_table():
    import pandas as pd

    from lab.ablation import COLUMNS

    rows = [("baseline", 1.0, 1.0, 1.0, 0.0, True, 0.2), ("fast", 2.0, 1.5, 2.5, 0.5, False, None),
            ("broken", None, None, None, None, None, None)]
    out = []
    for arm, s, lo, hi, loss, noise, noise_pt in rows:
        row = {c: None for c in COLUMNS} | {"arm": arm, "status": "error" if s is None else "ok", "why": "",
                                             "acc_loss_pt": loss, "within_noise": noise, "noise_pt": noise_pt}
        for k in ("train_speedup", "infer_speedup"):
            row |= {k: s, f"{k}_lo": lo, f"{k}_hi": hi}
        out.append(row)
    return pd.DataFrame(out)


def test_speedup_vs_accuracy_has_whiskers_front_and_noise_band():
    from lab.plots import speedup_vs_accuracy

    fig = speedup_vs_accuracy(_ablation_table(), front=["fast", "baseline"], budget_pt=1.0)
    front, arms = fig.data
    assert front.name == "Pareto front" and list(front.x) == [1.0, 2.0]
    assert list(arms.text) == ["baseline", "fast"]  # the error row is not plotted
    assert list(arms.error_x.array) == [0.0, 0.5] and list(arms.error_x.arrayminus) == [0.0, 0.5]
    rect = [s for s in fig.layout.shapes if s.type == "rect"][0]
    assert (rect.y0, rect.y1) == (-0.2, 0.2)  # the baseline's seed spread


def test_speedup_bars_one_trace_per_speed_with_ci():
    from lab.plots import speedup_bars

    fig = speedup_bars(_ablation_table())
    assert len(fig.data) == 2 and list(fig.data[1].y) == [1.0, 2.0]
    assert list(fig.data[0].error_y.array) == [0.0, 0.5]


def test_technique_figures_show_only_what_applies():
    from lab.plots import technique_figures

    plain = _result("a" * 32, 1.0, 0.5)
    assert list(technique_figures(plain)) == ["data wait per step"]
    pruned = _result("b" * 32, 1.0, 0.5)
    pruned.details = {"prune": {"method": "l1_unstructured", "amount": 0.5, "schedule": "oneshot",
                                "layers": {"fc": {"sparsity": 0.5, "shape": [2, 2], "nonzero": 2}}},
                      "precision": {"phases": {"train": {"loss_scale_history": [65536.0, 32768.0],
                                                         "skipped_steps": [0], "grad_norms": [1.0, 0.9]}}}}
    figs = technique_figures(pruned)
    assert set(figs) == {"data wait per step", "per-layer sparsity", "loss scale (fp16)"}
    assert list(figs["per-layer sparsity"].data[0].y) == [50.0]
    assert list(figs["loss scale (fp16)"].data[0].y) == [65536.0, 32768.0]
