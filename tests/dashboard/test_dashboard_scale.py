"""The "Where does it pay?" page driven headless through Streamlit's AppTest on a synthetic map: it draws the
chart, places a workload and a model given by numbers, and says so when there is no map."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab.crossover import Line, analyse, write_map  # noqa: E402


def _page() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path.cwd() / "dashboard"))
    import page_scale

    page_scale.render()


def _synthetic_map(path) -> None:
    base, tech = Line(2.0, 0.05), Line(6.0, 0.025)
    facts, rows = [], []
    for i, rung in enumerate(["xs", "s", "m", "l", "xl"]):
        macs, params = 10.0 ** (5 + i), 10 ** (3 + i)
        facts.append({"workload": "sequence", "rung": rung, "params": params, "macs_per_sample": macs,
                      "batch_size": 32})
        b, t = float(base(macs)), float(tech(macs))
        rows.append({"workload": "sequence", "rung": rung, "params": params, "macs_per_sample": macs,
                     "technique": "bf16", "axis": "train_step", "speedup": b / t, "ci_lo": 0.97 * b / t,
                     "ci_hi": 1.03 * b / t, "base_ms": b, "tech_ms": t, "why": ""})
    write_map({**analyse(rows, facts), "env": {"device_name": "test CPU"}}, path)


def test_page_draws_the_map_and_places_a_model(tmp_path, monkeypatch) -> None:
    path = tmp_path / "crossover.json"
    _synthetic_map(path)
    monkeypatch.setenv("LAB_CROSSOVER_JSON", str(path))
    at = AppTest.from_function(_page, default_timeout=60).run()
    assert not at.exception, at.exception
    assert at.header[0].value == "Where does it pay?"
    assert at.selectbox(key="scale_workload").options == ["sequence"]
    assert len(at.get("plotly_chart")) >= 1
    assert any("sequence" in m.value and "parameters" in m.value for m in at.markdown)  # placed the built-in
    at.radio(key="scale_place_mode").set_value("numbers").run()
    at.number_input(key="scale_macs").set_value(5e9).run()
    assert not at.exception
    assert any("predicted to pay: bf16" in m.value for m in at.markdown)
    assert json.loads(path.read_text())["crossovers"][0]["measured_rung"] == "xl"


def test_page_without_a_map_says_how_to_make_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LAB_CROSSOVER_JSON", str(tmp_path / "none.json"))
    at = AppTest.from_function(_page, default_timeout=30).run()
    assert not at.exception
    assert any("python -m lab crossover" in i.value for i in at.info)


def test_the_threads_table_reads_its_figures_rounded(tmp_path, monkeypatch) -> None:
    """The worker-or-thread table printed raw floats ("7.576165200146079 ms"), which widened it past the page at
    1280 px once a machine's own study was there (the browser test caught it on an AMD EPYC)."""
    import shutil
    from pathlib import Path

    studies = sorted(Path("benchmarks/results").glob("*/crossover_threads.json"))
    assert studies, "the committed results hold at least one threads study"
    shutil.copy(studies[0], tmp_path / "crossover_threads.json")
    monkeypatch.setenv("LAB_CROSSOVER_JSON", str(tmp_path / "none.json"))
    monkeypatch.setenv("LAB_CROSSOVER_THREADS_JSON", str(tmp_path / "crossover_threads.json"))
    at = AppTest.from_function(_page, default_timeout=60).run()
    assert not at.exception, at.exception
    (table,) = [d for d in at.dataframe if "loader ms/batch" in d.value.columns]
    for col in ("loader ms/batch", "compute ms/step"):
        assert all(len(str(v).replace(".", "").lstrip("0")) <= 3 for v in table.value[col]), table.value[col]
