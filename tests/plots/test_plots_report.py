"""The performance report's figure and table: ratio rows only, CI whiskers from the report's CIs, each
hardware in its own labelled panel, skipped figures left out of the plot but kept (with why) in the table."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("plotly")

from lab.plots.report import load_reports, report_figure, report_frame, report_table  # noqa: E402


def _row(hw, name, value, *, unit="x", ci=None, family="precision", goal=None, met=None, note=""):
    return {"benchmark": family, "family": family, "name": name, "value": value, "unit": unit, "ci95": ci,
            "goal": goal, "met": met, "note": note, "quick": True, "hardware_id": hw, "device_name": f"{hw} device",
            "git_sha": "abc", "previous": None, "within_ci": None, "rel_change": None}


ROWS = [
    _row("cpu-2c", "bf16 speedup", 1.5, ci=[1.25, 1.75], goal=">= 1.3x", met=True, note="AMX"),
    _row("cpu-2c", "int8 speedup", 0.8, ci=[0.7, 0.95], family="quantization", goal=">= 2.5x", met=False),
    _row("cpu-2c", "step time", 12.0, unit="ms"),  # not a ratio
    _row("cpu-2c", "2:4 sparse speedup", math.nan, family="pruning", note="skipped: no CUDA"),
    _row("nvidia-h200", "bf16 speedup", 2.5, ci=[2.4, 2.75], goal=">= 1.3x", met=True),
    _row("nvidia-h200", "A/A", 1.0),  # a ratio without CI or goal
]


def _points(fig):
    """(hardware, label) -> (x, whisker plus, whisker minus, trace name, x axis) for every plotted point."""
    out = {}
    for t in fig.data:
        for i, label in enumerate(t.y):
            out[(t.customdata[i][0], label)] = (t.x[i], t.error_x.array[i], t.error_x.arrayminus[i], t.name,
                                                t.xaxis)
    return out


def test_report_figure_plots_ratio_rows_with_ci_whiskers():
    points = _points(report_figure(ROWS))
    # the ms row (not a ratio) and the NaN row (skipped) are not plotted
    assert set(points) == {("cpu-2c", "precision: bf16 speedup"), ("cpu-2c", "quantization: int8 speedup"),
                           ("nvidia-h200", "precision: bf16 speedup"), ("nvidia-h200", "precision: A/A")}
    x, plus, minus, status, _ = points[("cpu-2c", "precision: bf16 speedup")]
    assert (x, plus, minus, status) == (1.5, pytest.approx(0.25), pytest.approx(0.25), "met")
    x, plus, minus, status, _ = points[("cpu-2c", "quantization: int8 speedup")]
    assert (x, plus, minus, status) == (0.8, pytest.approx(0.15), pytest.approx(0.1), "not met")  # asymmetric
    assert points[("nvidia-h200", "precision: A/A")][1:4] == (0.0, 0.0, "no goal")


def test_report_figure_separates_and_labels_hardware():
    fig = report_figure(ROWS)
    points = _points(fig)
    cpu_axis = points[("cpu-2c", "precision: bf16 speedup")][4]
    gpu_axis = points[("nvidia-h200", "precision: bf16 speedup")][4]
    assert cpu_axis != gpu_axis  # one panel per hardware
    titles = [a.text for a in fig.layout.annotations]
    assert any("cpu-2c" in t for t in titles) and any("nvidia-h200" in t and "nvidia-h200 device" in t for t in titles)
    assert [s.x0 for s in fig.layout.shapes] == [1.0, 1.0]  # the no-change line in both panels
    # the legend names each status once, whatever the number of panels
    assert sorted(t.name for t in fig.data if t.showlegend is not False) == ["met", "no goal", "not met"]


def test_report_figure_accepts_a_frame_and_survives_nothing_to_plot():
    import pandas as pd

    frame = pd.DataFrame(ROWS)
    assert _points(report_figure(frame)) == _points(report_figure(ROWS))
    empty = report_figure([r for r in ROWS if r["unit"] != "x" or math.isnan(r["value"])])
    assert not empty.data and "no ratio figures" in empty.layout.annotations[0].text


def test_load_reports_frame_and_table(tmp_path):
    for hw in ("cpu-2c", "nvidia-h200"):
        (tmp_path / hw).mkdir()
        rows = [r for r in ROWS if r["hardware_id"] == hw]
        (tmp_path / hw / "report.json").write_text(json.dumps({"hardware_id": hw, "env": {}, "rows": rows}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "report.json").write_text("{not json")
    reports, problems = load_reports(tmp_path)
    assert list(reports) == ["cpu-2c", "nvidia-h200"]
    assert len(problems) == 1 and "broken" in problems[0]
    table = report_table(report_frame(reports))
    assert list(table["hardware"]) == ["cpu-2c"] * 4 + ["nvidia-h200"] * 2
    skipped = table[table["figure"] == "2:4 sparse speedup"].iloc[0]
    assert math.isnan(skipped["measured"]) and skipped["note"] == "skipped: no CUDA"  # kept in the table
    first = table.iloc[0]
    assert (first["measured"], first["CI"], first["goal"], first["met"]) == (1.5, "[1.25, 1.75]", ">= 1.3x", "met")
    assert load_reports(tmp_path / "absent") == ({}, [])


def test_speed_size_memory_and_macs_ratios_never_share_an_axis():
    rows = [_row("cpu-2c", "bf16 speedup", 1.5, ci=[1.25, 1.75]),
            _row("cpu-2c", "int8 size ratio", 3.9, family="quantization"),
            _row("cpu-2c", "peak memory ratio", 1.2, family="precision"),
            _row("cpu-2c", "prune50 MACs ratio", 1.7, family="pruning"),
            _row("cpu-2c", "noisy speedup", 1.1, ci=[0.09, 8.7], family="compute"),
            _row("cpu-2c", "naive / in-memory", 0.77, family="data")]  # a loader's name, not a memory ratio
    fig = report_figure(rows)
    axis = {t.y[i]: t.xaxis for t in fig.data for i in range(len(t.y))}
    kinds = [axis["precision: bf16 speedup"], axis["quantization: int8 size ratio"],
             axis["precision: peak memory ratio"], axis["pruning: prune50 MACs ratio"]]
    assert len(set(kinds)) == 4  # one axis per kind of ratio
    assert axis["data: naive / in-memory"] == axis["precision: bf16 speedup"]
    titles = {fig.layout[a.replace("x", "xaxis")].title.text for a in kinds}
    assert titles == {"speedup (x, 1 = no change)", "size ratio (x smaller)", "memory ratio (x less)",
                      "MACs ratio (x fewer)"}
    speed_axis = fig.layout[axis["compute: noisy speedup"].replace("x", "xaxis")]
    assert speed_axis.range[1] < 8.7  # the wild whisker is clipped ...
    noisy = next(t for t in fig.data if "compute: noisy speedup" in t.y)
    assert "clipped" in noisy.customdata[list(noisy.y).index("compute: noisy speedup")][1]  # ... and says so


def test_a_goal_met_on_the_point_only_is_its_own_status_in_the_figure_and_the_table():
    shaky = dict(_row("cpu-2c", "ctr stack", 3.16, ci=[2.73, 3.49], family="stacked", goal=">= 3x", met=True),
                 met_beyond_noise=False)
    firm = dict(_row("cpu-2c", "vision int8", 4.39, ci=[4.19, 4.41], family="quantization", goal=">= 4x",
                     met=True), met_beyond_noise=True)
    points = _points(report_figure([shaky, firm]))
    assert points[("cpu-2c", "stacked: ctr stack")][3] == "met, point only"
    assert points[("cpu-2c", "quantization: vision int8")][3] == "met"
    table = report_table(report_frame({"cpu-2c": {"hardware_id": "cpu-2c", "env": {}, "rows": [shaky, firm]}}))
    assert list(table["met"]) == ["met, point only", "met"]


@settings(max_examples=80, deadline=None)
@given(parts=st.lists(st.text(alphabet="abcdefghij0123456789()", min_size=1, max_size=9), min_size=1, max_size=6),
       seps=st.lists(st.sampled_from(["-", " "]), min_size=6, max_size=6), width=st.integers(10, 30))
def test_a_facet_title_wraps_within_its_column_and_keeps_every_character(parts, seps, width):
    """The report's hardware titles printed over each other at 1280 px (three ids with their CPU names on one line):
    each is wrapped at spaces or after hyphens, no line longer than its column unless one word is."""
    from lab.plots.report import _wrapped

    text = "".join(p + s for p, s in zip(parts, seps, strict=False)).rstrip(" -") or "x"
    lines = _wrapped(text, width).split("<br>")
    assert all(len(line) <= width or " " not in line and line.count("-") <= 1 for line in lines)
    assert "".join(lines).replace(" ", "") == text.replace(" ", "")
