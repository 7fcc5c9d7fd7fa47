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


def test_run_with_techniques_shows_why_and_details():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.selectbox(key="workload").select("ctr")
    at.selectbox(key="size").select("tiny")
    at.number_input(key="threads").set_value(1)
    at.selectbox(key="prune_method").select("l1_unstructured").run()  # enables the amount widgets
    at.slider(key="prune_amount").set_value(0.5)
    at.number_input(key="finetune_epochs").set_value(0)
    at.button(key="run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert any(e.label == "Technique details" for e in at.expander)
    from lab import ResultStore

    with ResultStore() as store:
        (res,) = store.list_results()
    assert res.config["prune"]["method"] == "l1_unstructured" and "prune" in res.details


def test_combination_that_cannot_run_is_a_message_not_a_traceback():
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.selectbox(key="size").select("tiny")
    at.selectbox(key="precision").select("fp16")
    at.selectbox(key="quant_method").select("static")
    at.button(key="run").click().run()
    assert not at.exception
    assert at.error and "Cannot run this combination" in at.error[0].value
