"""Predicted vs measured in the ablation views (issue 15 item 3), the profile toggle's breakdown in the
technique details (issue 20 item 1) and a capability-gate refusal shown as "does not apply here": the
figure on synthetic rows, the views through AppTest on a synthetic crossover map (``LAB_CROSSOVER_JSON``) and
fake runs, so nothing trains here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab import ResultStore, RunConfig  # noqa: E402
from lab.crossover import Line, analyse, write_map  # noqa: E402
from lab.plots import technique_figures  # noqa: E402
from lab.plots.versus import agrees, versus_figure, versus_table  # noqa: E402
from lab.result import RunResult, new_run_id  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
ROWS = [  # predicted inside, outside, and without an interval (n < 3: NaN bounds)
    {"arm": "bf16", "technique": "bf16", "axis": "train_step", "predicted": 1.2, "measured": 1.25,
     "measured_lo": 1.1, "measured_hi": 1.4, "agrees": True},
    {"arm": "int8_dynamic", "technique": "dynamic_int8", "axis": "inference", "predicted": 2.0, "measured": 0.8,
     "measured_lo": 0.7, "measured_hi": 0.9, "agrees": False},
    {"arm": "fp16", "technique": "fp16", "axis": "train_step", "predicted": 0.9, "measured": 0.85,
     "measured_lo": math.nan, "measured_hi": math.nan, "agrees": False},
    {"arm": "bf16", "technique": "bf16", "axis": "inference", "predicted": 0.8, "measured": None,
     "measured_lo": None, "measured_hi": None, "agrees": None},
]


def test_versus_figure_has_one_marker_per_arm_and_axis_whiskers_and_the_identity_line():
    fig = versus_figure(ROWS)
    points = {t.name: t for t in fig.data if t.mode == "markers+text"}
    assert set(points) == {"training step", "inference"}
    step = points["training step"]
    assert list(step.text) == ["bf16", "fp16"] and list(step.x) == [1.2, 0.9] and list(step.y) == [1.25, 0.85]
    assert list(step.error_y.array) == pytest.approx([0.15, 0.0]) and list(step.error_y.arrayminus) == \
        pytest.approx([0.15, 0.0])  # no interval: no whisker, never a NaN one
    assert "predicted" in step.hovertemplate and list(step.customdata[0]) == ["bf16", "bf16", "[1.1, 1.4]", "yes"]
    assert list(points["inference"].text) == ["int8_dynamic"]  # the unmeasured row has no marker
    (ident,) = [t for t in fig.data if t.mode == "lines"]
    assert list(ident.x) == list(ident.y) and ident.x[0] < 0.8 and ident.x[1] > 2.0
    table = versus_table(ROWS)
    assert list(table["Agrees"]) == ["yes", "no", "no interval", "no interval"]
    assert table["Measured (x, 95 % CI)"].iloc[3] == "not measured"
    assert [agrees(r) for r in ROWS] == [True, False, None, None]


def _synthetic_map(path: Path, family: str = "sequence") -> None:
    base, tech = Line(2.0, 0.05), Line(6.0, 0.025)  # bf16 loses on small models, wins on large ones
    facts, rows = [], []
    for i, rung in enumerate(["xs", "s", "m", "l"]):
        macs, params = 10.0 ** (4 + i), 10 ** (3 + i)
        facts.append({"workload": family, "rung": rung, "params": params, "macs_per_sample": macs,
                      "batch_size": 32})
        b, t = float(base(macs)), float(tech(macs))
        rows.append({"workload": family, "rung": rung, "params": params, "macs_per_sample": macs,
                     "technique": "bf16", "axis": "train_step", "speedup": b / t, "ci_lo": 0.97 * b / t,
                     "ci_hi": 1.03 * b / t, "base_ms": b, "tech_ms": t, "why": ""})
    write_map({**analyse(rows, facts), "env": {"device_name": "test CPU"}}, path)


PROFILE = {"train": {"step_ms": 10.0, "ms": {"matmul": 6.0, "elementwise": 3.0, "overhead": 1.0}},
           "inference": {"step_ms": 2.0, "ms": {"matmul": 1.5, "overhead": 0.5}, "batch": 32},
           "steps": {"warmup": 2, "active": 5}, "trace": "/tmp/x.json"}


def _fake_run(cfg: RunConfig, **_: object) -> RunResult:
    """A finished run without training: bf16 steps are 4/3 faster; fp16 is refused as the gate refuses it."""
    from lab.precision import NotApplicable

    if cfg.precision.dtype == "fp16":
        raise NotApplicable("precision.dtype='fp16' cannot train this model here: fp16 on CPU with Conv2d layers")
    ms = 3.0 if cfg.precision.dtype == "bf16" else 4.0
    steps = [ms * (1 + 0.01 * i) for i in range(8)]
    return RunResult(run_id=new_run_id(), config=cfg.to_dict(), env={"hardware_id": "hw"},
                     workload=cfg.workload, metric_name="accuracy", metric=0.9, train_time_s=sum(steps) / 1e3,
                     steps=len(steps), step_times_ms={"total": steps}, latency_ms={"batch_32": [1.0, 1.1, 0.9]},
                     model_bytes=100, macs_per_sample=10, details={"profile": PROFILE} if cfg.profile else {})


def test_profiled_run_shows_the_op_class_breakdown_in_its_details():
    run = _fake_run(RunConfig(workload="sequence", size="tiny", profile=True))
    fig = technique_figures(run)["op classes (profiled)"]
    assert [b.y[0] for b in fig.data if b.name == "matmul"] == ["training step"]
    assert {b.name: list(b.x) for b in fig.data}["matmul"] == [6.0, 1.5]  # training step and inference bars
    assert "op classes (profiled)" not in technique_figures(_fake_run(RunConfig(workload="sequence", size="tiny")))


def test_ablation_tabs_show_predicted_vs_measured_refusals_and_profiles(private_store, tmp_path, monkeypatch):
    from lab.ablation import run_ablation
    from lab.recipes import from_techniques

    _synthetic_map(tmp_path / "crossover.json")
    monkeypatch.setenv("LAB_CROSSOVER_JSON", str(tmp_path / "crossover.json"))
    base = RunConfig(workload="sequence", size="tiny", threads=1, profile=True)
    ab = from_techniques("custom", base, [["bf16"], ["fp16"], ["prune50"]])
    with ResultStore(private_store) as store:  # a finished job in the store: the Ablation tab shows its table
        run_ablation(ab, repeats=3, store=store, run_fn=_fake_run)
    at = AppTest.from_file(APP, default_timeout=90).run()
    assert not at.exception, at.exception
    assert at.checkbox(key="profile").value is False  # the toggle is there (off by default)
    charts = " ".join(el.proto.id for el in at.get("plotly_chart"))
    assert "versus_chart" in charts and "stored_versus_chart" in charts  # Ablation and Stored-runs tabs
    table = next(d.value for d in at.dataframe if "Agrees" in d.value.columns)
    assert list(table["Arm"]) == ["bf16"] and table["Axis"].iloc[0] == "training step"
    assert table["Agrees"].iloc[0] in ("yes", "no")  # 3 runs per arm: an interval to hold the prediction to
    assert any("fp16 does not apply here" in i.value and "Conv2d" in i.value for i in at.info)
    assert not [e.value for e in at.error]  # a refused arm is not a failed arm
    ablation = next(d.value for d in at.dataframe if "Arm" in d.value.columns and "Status" in d.value.columns)
    assert ablation.set_index("Arm").loc["fp16", "Step speedup (x, 95 % CI)"] == "does not apply here"
    at.selectbox(key="detail_arm").select("bf16").run()
    assert "detail_op classes (profiled)" in " ".join(el.proto.id for el in at.get("plotly_chart"))


def _versus_only(kind: str, dashboard: str) -> None:
    import sys

    import pandas as pd

    sys.path.insert(0, dashboard)
    import _views

    from lab import RunConfig
    from lab.result import RunResult

    workload = "ctr" if kind == "unplaceable" else "sequence"
    arm = "prune50" if kind == "no_arm" else "bf16"
    df = pd.DataFrame([{"arm": "baseline", "step_speedup": 1.0, "axes": "train_step,train"},
                       {"arm": arm, "step_speedup": 1.1, "axes": "train_step,train"}])
    run = RunResult(run_id="0" * 32, config=RunConfig(workload=workload, size="tiny").to_dict(), env={})
    _views.show_versus(df, {"baseline": [run]})


@pytest.mark.parametrize("kind, says", [("no_map", "No crossover map for this hardware id"),
                                        ("no_arm", "No arm of this ablation has a row of the same name"),
                                        ("unplaceable", "The map cannot place `ctr`")])
def test_versus_without_a_map_an_arm_or_a_ladder_says_so_in_one_line(kind, says, tmp_path, monkeypatch):
    path = tmp_path / "crossover.json"
    if kind != "no_map":
        _synthetic_map(path)
    monkeypatch.setenv("LAB_CROSSOVER_JSON", str(path))
    at = AppTest.from_function(_versus_only, args=(kind, str(Path(APP).parent)), default_timeout=60).run()
    assert not at.exception, at.exception
    assert any(says in i.value for i in at.info), [i.value for i in at.info]
    assert not at.get("plotly_chart")


def test_cli_ablate_prints_predicted_vs_measured(toy_workload, tmp_path, monkeypatch, capsys):
    from lab.cli import main

    _synthetic_map(tmp_path / "crossover.json", family="transformer")  # a Linear stack reads as transformer
    monkeypatch.setenv("LAB_CROSSOVER_JSON", str(tmp_path / "crossover.json"))
    assert main(["ablate", "--workload", "toy", "--size", "tiny", "--techniques", "bf16", "--repeats", "1",
                 "--threads", "1", "--store", str(tmp_path / "r.sqlite")]) == 0
    out = capsys.readouterr().out
    assert "map predicted bf16 (train_step) x" in out and "(no interval)" in out
    assert "bf16 (inference)" not in out  # a precision arm does not compete on inference
    monkeypatch.setenv("LAB_CROSSOVER_JSON", str(tmp_path / "none.json"))
    assert main(["ablate", "--workload", "toy", "--size", "tiny", "--techniques", "bf16", "--repeats", "1",
                 "--threads", "1", "--store", str(tmp_path / "r.sqlite")]) == 0  # resumed: nothing trains again
    assert "predicted vs measured: no crossover map for this hardware id" in capsys.readouterr().out
