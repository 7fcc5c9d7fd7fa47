"""Utilisation: a run's step and inference call against the machine card's GEMM peaks, from planted figures
(known MACs, time and peak) and on a real run."""

from __future__ import annotations

import pytest

from lab import RunConfig, run
from lab.measure.utilisation import peak_gflops, run_utilisation, share_of_peak, utilisation_line
from lab.result import RunResult

CARD = {"hardware_id": "planted", "measured_at": "t",
        "peaks": {"gemm_gflops": {"fp32": {"1": 100.0, "all": 180.0}, "bf16": {"1": 200.0, "all": 390.0},
                                  "int8": {"1": 400.0}}}}


def test_the_share_is_the_peak_time_of_the_work_over_the_measured_time():
    # 1e9 MACs forward + backward = 6e9 FLOPs; at 100 GFLOP/s that is 60 ms; measured 120 ms -> 50 %
    u = share_of_peak({"fp32": 1e9}, 120.0, CARD, threads=1, forwards=3)
    assert u["share"] == pytest.approx(0.5) and u["ideal_ms"] == pytest.approx(60.0)
    assert u["achieved_gflops"] == pytest.approx(50.0) and u["peaks"] == {"fp32": {"gflops": 100.0, "threads": "1"}}
    # int8 and fp32 MACs each at their own peak: 2e9 FLOPs at 400 + 2e9 at 100 = 5 + 20 ms of a 50 ms call
    mixed = share_of_peak({"fp32": 1e9, "int8": 1e9}, 50.0, CARD, threads=1)
    assert mixed["share"] == pytest.approx(0.5)
    assert share_of_peak({"fp16": 1e9}, 10.0, CARD, threads=1) is None  # no peak measured: no guess
    assert share_of_peak({"fp32": 1e9}, 0.0, CARD, threads=1) is None


def test_the_peak_read_is_the_measured_thread_count_nearest_the_runs(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert peak_gflops(CARD, "fp32", 1) == (100.0, "1") and peak_gflops(CARD, "fp32", 8) == (180.0, "all")
    assert peak_gflops(CARD, "int8", 8) == (400.0, "1")  # only 1 thread measured: that one, and it says so


def test_a_planted_run_record_and_a_record_without_a_card():
    r = RunResult(run_id="x", config={}, env={"machine_card": CARD, "torch_threads": 1}, batch_size=100,
                  macs_per_sample=10_000_000, warmup_steps=0, step_times_ms={"total": [60.0, 60.0, 60.0]},
                  latency_ms={"batch_1": [1.0], "batch_100": [40.0, 40.0, 40.0]},
                  details={"precision": {"resolved": "bf16"}})
    u = run_utilisation(r)
    # 1e9 MACs per step x 6 FLOPs / MAC-forward-backward at the bf16 peak of 200 GFLOP/s = 30 ms of 60 ms
    assert u["train_step"]["share"] == pytest.approx(0.5) and u["train_step"]["dtype"] == "bf16"
    assert u["inference"]["share"] == pytest.approx(0.5) and u["inference"]["batch"] == 100  # 20 ms of 40
    assert "train step 50 % " in utilisation_line({"utilisation": u})
    none = run_utilisation(RunResult(run_id="x", config={}, env={}))
    assert "python -m lab machine" in none["why"] and "python -m lab machine" in utilisation_line({"utilisation": none})


def test_a_real_run_sits_between_zero_and_the_peak(toy_workload):
    r = run(RunConfig(workload="toy", size="tiny", threads=1, max_steps=12, warmup_steps=2, latency_repeats=3))
    assert "utilisation" in r.details  # with or without a card on this machine, the record says which
    r.env["machine_card"] = CARD  # a card with this machine's order of magnitude: the real times and MACs
    u = run_utilisation(r)
    assert 0 < u["train_step"]["share"] < 1 and 0 < u["inference"]["share"] < 1
    assert u["train_step"]["measured_ms"] == pytest.approx(r.median_step_ms)


def test_a_maps_baseline_is_read_once_per_rung_and_axis_against_the_card_it_carries():
    """The crossover map's rows time the same fp32 baseline beside each technique: one utilisation per rung and
    axis, from the rung's MACs and batch (train step: 3 forwards), and none at all from a map without a card."""
    from lab.measure import map_utilisation
    from lab.plots.scale import utilisation_figure

    rungs = [{"workload": "mlp", "rung": r, "params": p, "macs_per_sample": m, "batch_size": 100}
             for r, p, m in (("xs", 1e4, 1e4), ("xl", 1e7, 1e7))]
    rows = [{"workload": "mlp", "rung": r, "axis": a, "technique": t, "base_ms": ms}
            for r, ms in (("xs", 1.0), ("xl", 100.0)) for a in ("train_step", "inference") for t in ("bf16", "int8")]
    the_map = {"machine_card": CARD, "threads": 1, "rungs": rungs, "rows": rows}
    got = {(u["rung"], u["axis"]): u["share"] for u in map_utilisation(the_map)}
    # xl train: 1e7 MACs x 100 x 2 x 3 = 6e9 FLOPs at 100 GFLOP/s = 60 ms of 100 ms; inference 20 ms of 100 ms
    assert got == pytest.approx({("xs", "train_step"): 0.06, ("xs", "inference"): 0.02,
                                 ("xl", "train_step"): 0.6, ("xl", "inference"): 0.2})
    fig = utilisation_figure(the_map, "train_step")
    assert [list(t.y) for t in fig.data] == [pytest.approx([6.0, 60.0])]  # per cent, ordered by size
    assert map_utilisation({**the_map, "machine_card": None}) == []
    assert "no machine card" in utilisation_figure({**the_map, "machine_card": None}).layout.annotations[0].text
