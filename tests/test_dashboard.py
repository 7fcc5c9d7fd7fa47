"""The Streamlit app driven headless through Streamlit's AppTest: pick, run on tiny, see the result."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


def test_app_starts_with_instructions():
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert any("Run" in info.value for info in at.info)
    assert {"ctr", "sequence", "vision"} <= set(at.selectbox(key="workload").options)


def test_run_tiny_shows_result_and_stores_it(private_store):
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.selectbox(key="workload").select("sequence")
    at.selectbox(key="size").select("tiny")
    at.number_input(key="threads").set_value(1)
    at.button(key="run").click().run()
    assert not at.exception, at.exception
    labels = [m.label for m in at.metric]
    assert "accuracy" in labels and "train time" in labels
    assert private_store.exists()
    from lab import ResultStore

    with ResultStore(private_store) as store:
        df = store.load_runs()
    assert len(df) == 1 and df.iloc[0]["workload"] == "sequence"
