"""The "Workers vs threads" page: draws the committed grid (or says how to make one) and the rule calculator
answers with :func:`lab.data.studies.threads.recommend`."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab.data.studies.threads import grid_rows, load_grids, recommend  # noqa: E402


def _page() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path.cwd() / "dashboard"))
    from page_data_threads import render

    render()


def test_page_renders_and_the_rule_follows_the_inputs(monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[2])
    at = AppTest.from_function(_page, default_timeout=60).run()
    assert not at.exception
    assert at.header[0].value == "Workers vs threads"
    at.number_input(key="dt_cores").set_value(4)
    at.number_input(key="dt_loader_ms").set_value(90.0)
    at.number_input(key="dt_compute_ms").set_value(40.0).run()
    assert not at.exception
    assert any(recommend(4, 90.0, 40.0)["text"] in m.value for m in at.markdown)


def test_rule_and_grid_helpers(tmp_path):
    assert (recommend(2, 30.0, 40.0)["threads"], recommend(2, 30.0, 40.0)["workers"]) == (1, 1)
    assert recommend(8, 90.0, 40.0)["workers"] == 3 and recommend(8, 90.0, 40.0)["threads"] == 5
    assert recommend(4, 0.0, 40.0)["workers"] == 0 and recommend(1, 50.0, 10.0)["threads"] == 1
    with pytest.raises(ValueError, match="cores=0"):
        recommend(0, 1.0, 1.0)
    row = {"threads": 1, "workers": 1, "throughput": 100.0, "vs_best": 1.0, "vs_best_ci95": [0.9, 1.1],
           "data_wait_fraction": 0.01, "worker_cpu_s": 1.0, "training_process_cpu_s": 2.0}
    grid = {"rows": [row], "best": {"threads": 1, "workers": 1, "throughput": 100.0}, "workload": "vision"}
    (tmp_path / "d.json").write_text(json.dumps({"grids": [grid]}))
    grids, src = load_grids(tmp_path / "d.json")
    assert grid_rows(grids[0])[0]["CI95"] == "[0.90, 1.10]" and src.endswith("d.json")
    assert load_grids(tmp_path / "none.json") == ([], None)
