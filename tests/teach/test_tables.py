"""The technique notebooks' side-by-side table (lab.plots.tables.technique_table) on synthetic runs: every figure
is computed from the runs handed in, each interval is the bootstrap of those samples, and a column no run fills
is left out."""

from __future__ import annotations

import pandas as pd
import pytest

from lab.measure import bootstrap_ci, bootstrap_ratio_ci
from lab.plots.tables import technique_table
from lab.result import RunResult


def _run(steps: list[float], lat: list[float], metric: float, *, nbytes: int = 400, macs: int = 40,
         details: dict | None = None) -> RunResult:
    return RunResult(run_id="x" * 32, config={"seed": 0}, env={"hardware_id": "hw"}, workload="ctr",
                     metric_name="accuracy", metric=metric, warmup_steps=1, steps=len(steps),
                     step_times_ms={"total": steps}, latency_ms={"batch_256": lat} if lat else {},
                     model_bytes=nbytes, macs_per_sample=macs, details=details or {})


BASE_STEPS, FAST_STEPS = [9.0, 4.0, 4.2, 3.9, 4.1, 4.3], [9.0, 2.0, 2.1, 1.9, 2.05, 2.2]


def test_each_column_is_the_runs_figure_with_its_interval() -> None:
    base = _run(BASE_STEPS, [4.0, 4.2, 3.9, 4.1], 0.90)
    fast = _run(FAST_STEPS, [2.0, 2.1, 1.9, 2.0], 0.88, nbytes=100, macs=20)
    table = technique_table({"dense": base, "fast": fast}, reference=base).set_index("Run")
    est, lo, hi = bootstrap_ci([2.0, 2.1, 1.9, 2.0])
    assert table.loc["fast", "Latency (ms, 95 % CI)"] == f"{est:.3g} [{lo:.3g}, {hi:.3g}] at batch 256"
    est, lo, hi = bootstrap_ci(FAST_STEPS[1:])  # the warm-up step is not a measured one
    assert table.loc["fast", "Training step (ms, 95 % CI)"] == f"{est:.3g} [{lo:.3g}, {hi:.3g}]"
    ratio, lo, hi = bootstrap_ratio_ci(BASE_STEPS[1:], FAST_STEPS[1:])
    assert table.loc["fast", "Step speedup (x, 95 % CI)"].startswith(f"{ratio:.2g}") and lo > 1.5
    assert table.loc["dense", "Step speedup (x, 95 % CI)"] == "1x (reference)"
    assert table.loc["fast", "Size"] == "4x smaller" and table.loc["fast", "MACs per sample"] == "20"
    assert table.loc["fast", "Accuracy loss (95 % CI)"] == "+2 pt (n = 1: no interval)"
    assert table.loc["fast", "Metric"] == "accuracy 0.88"


def test_an_int8_run_reads_size_and_the_paired_accuracy_interval_from_its_own_float_model() -> None:
    quant = {"size_ratio": 3.9, "accuracy": {"accuracy": {"loss_pts": 0.4, "ci_lo": -0.1, "ci_hi": 0.9}}}
    table = technique_table({"int8": _run(FAST_STEPS, [1.0, 1.1], 0.9, details={"quant": quant})})
    row = table.iloc[0]
    assert row["Size"] == "3.9x smaller" and row["Accuracy loss (95 % CI)"] == "+0.4 pt [-0.1, +0.9]"
    assert "Step speedup (x, 95 % CI)" not in table.columns  # no reference: nothing to compare steps with


def test_a_column_no_run_fills_is_dropped_and_one_sample_has_no_interval() -> None:
    table = technique_table({"a": _run([5.0, 3.0], [], 0.5)})
    assert isinstance(table, pd.DataFrame) and "Latency (ms, 95 % CI)" not in table.columns
    assert table.iloc[0]["Training step (ms, 95 % CI)"] == "3 (n = 1: no interval)"


@pytest.mark.parametrize("wrong", [0.5, 2.0])
def test_the_table_follows_the_samples(wrong: float) -> None:  # a table typed once would not move
    base = _run(BASE_STEPS, [4.0, 4.1], 0.9)
    other = _run([s * wrong for s in BASE_STEPS], [4.0, 4.1], 0.9)
    table = technique_table({"b": base, "o": other}, reference=base).set_index("Run")
    text = table.loc["o", "Step speedup (x, 95 % CI)"]
    assert text.startswith(f"{1 / wrong:.2g}")
