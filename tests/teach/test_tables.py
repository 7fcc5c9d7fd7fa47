"""The technique notebooks' side-by-side table (lab.plots.tables.technique_table) on synthetic runs: every figure
is computed from the runs handed in, each interval is the bootstrap of those samples, and a column no run fills
is left out."""

from __future__ import annotations

import dataclasses
import types

import pandas as pd
import pytest

from lab import RunConfig
from lab.measure import bootstrap_ci, bootstrap_ratio_ci
from lab.plots.tables import crossover_table, technique_table
from lab.recipes import from_techniques
from lab.result import RunResult
from lab.store import ResultStore
from lab.teach.runs import verification_runs


def _run(steps: list[float], lat: list[float], metric: float, *, nbytes: int = 400, macs: int = 40,
         details: dict | None = None, seed: int = 0) -> RunResult:
    return RunResult(run_id="x" * 32, config={"seed": seed}, env={"hardware_id": "hw"}, workload="ctr",
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


def test_repeats_are_pooled_and_three_seeds_each_give_the_accuracy_interval() -> None:
    base = [_run(BASE_STEPS, [], m, seed=i) for i, m in enumerate((0.90, 0.91, 0.905))]
    arm = [_run(FAST_STEPS, [], m, seed=i) for i, m in enumerate((0.88, 0.87, 0.875))]
    row = technique_table({"fp32": base, "bf16": arm}, reference=base).set_index("Run").loc["bf16"]
    ratio, lo, hi = bootstrap_ratio_ci(BASE_STEPS[1:] * 3, FAST_STEPS[1:] * 3)
    assert row["Step speedup (x, 95 % CI)"].startswith(f"{ratio:.2g}")
    assert row["Accuracy loss (95 % CI)"].startswith("+3 pt [")  # medians 0.905 vs 0.875


def test_crossover_table_reads_the_map_rows_of_one_workload_and_axis_smallest_first() -> None:
    the_map = {"rows": [
        {"workload": "mlp", "rung": "m", "params": 5000, "macs_per_sample": 4900.0, "technique": "bf16",
         "axis": "inference", "speedup": 1.5, "ci_lo": 1.2, "ci_hi": 1.8, "base_ms": 3.0, "tech_ms": 2.0,
         "regime": "compute-bound"},
        {"workload": "mlp", "rung": "xs", "params": 50, "macs_per_sample": 49.0, "technique": "bf16",
         "axis": "inference", "speedup": 0.8, "ci_lo": 0.7, "ci_hi": 0.9, "base_ms": 1.0, "tech_ms": 1.25,
         "regime": "dispatch-bound"},
        {"workload": "mlp", "rung": "xs", "params": 50, "macs_per_sample": 49.0, "technique": "bf16",
         "axis": "train_step", "speedup": 9.0, "ci_lo": 8.0, "ci_hi": 10.0, "base_ms": 9.0, "tech_ms": 1.0},
        {"workload": "ctr", "rung": "xs", "params": 7, "macs_per_sample": 7.0, "technique": "bf16",
         "axis": "inference", "speedup": None, "ci_lo": None, "ci_hi": None, "base_ms": 1.0, "tech_ms": None}]}
    table = crossover_table(the_map, "mlp", "inference")
    assert list(table["Rung"]) == ["xs", "m"] and list(table["Parameters"]) == ["50", "5,000"]
    assert list(table["Speedup (x, 95 % CI)"]) == ["0.8x [0.7, 0.9]", "1.5x [1.2, 1.8]"]
    assert list(table["Regime"]) == ["dispatch-bound", "compute-bound"]
    assert crossover_table(the_map, "ctr")["Speedup (x, 95 % CI)"].tolist() == ["not measured"]


def test_verification_runs_reads_back_each_arm_of_the_doctors_ablation(tmp_path) -> None:
    cfg = RunConfig(workload="ctr", size="tiny", threads=1)
    ablation = from_techniques("doctor", cfg, [["bf16"], ["prefetch"]])
    store = ResultStore(tmp_path / "lab.sqlite")
    for i, (arm, rep) in enumerate([("baseline", 0), ("baseline", 1), ("bf16", 0), ("prefetch", 1), ("aa", 0)]):
        store.add(dataclasses.replace(_run(BASE_STEPS, [], 0.9), run_id=f"{i:032d}"), label=ablation.label(arm, rep))
    store.add(dataclasses.replace(_run(BASE_STEPS, [], 0.9), run_id="9" * 32), label="another ablation")
    d = types.SimpleNamespace(cfg=cfg)
    got = verification_runs(d, [{"technique": "bf16"}, {"technique": "prefetch"}], repeats=2, store=store)
    assert {arm: len(rs) for arm, rs in got.items()} == {"baseline": 2, "bf16": 1, "prefetch": 1, "aa": 1}


def test_repeats_of_one_seed_give_no_accuracy_interval_rather_than_a_zero_width_one() -> None:
    base = [_run(BASE_STEPS, [], 0.9) for _ in range(3)]
    arm = [_run(FAST_STEPS, [], 0.88) for _ in range(3)]  # config seed 0 every time
    row = technique_table({"fp32": base, "x": arm}, reference=base).set_index("Run").loc["x"]
    assert row["Accuracy loss (95 % CI)"] == "+2 pt (3 runs of 1 seed(s): no interval)"
