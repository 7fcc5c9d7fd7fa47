"""The Doctor page driven headless through Streamlit's AppTest: it starts with instructions, profiles a tiny
workload into a breakdown chart and a ranked table, and verifies the top prediction (showing which run of how
many it is at)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402


def _page() -> None:
    # AppTest runs this function's source as its own script: imports and registration happen in here
    import sys
    from pathlib import Path

    root = Path.cwd()
    sys.path[:0] = [str(root / "dashboard"), str(root / "tests")]
    from page_doctor import render
    from toy_workload import TOY

    from lab.workloads import register_workload

    register_workload(TOY, overwrite=True)
    render()


def _chart_ids(at: AppTest) -> str:
    return " ".join(el.proto.id for el in at.get("plotly_chart"))


def test_doctor_page_profiles_predicts_and_verifies(private_store, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    at = AppTest.from_function(_page, default_timeout=120).run()
    assert not at.exception
    assert any("Profile and predict" in i.value for i in at.info)
    at.selectbox(key="doctor_workload").select("toy")
    at.selectbox(key="doctor_size").select("tiny")
    at.multiselect(key="doctor_techniques").set_value(["fused_optim", "prefetch"])
    at.button(key="doctor_run").click().run()
    assert not at.exception, at.exception
    assert "doctor_breakdown" in _chart_ids(at) and "doctor_prescription" in _chart_ids(at)
    table = at.dataframe[0].value
    assert set(table["technique"]) == {"fused_optim", "prefetch"}
    at.number_input(key="doctor_k").set_value(1)
    at.number_input(key="doctor_repeats").set_value(1)
    at.button(key="doctor_verify").click().run()
    assert not at.exception, at.exception
    assert "doctor_pvm" in _chart_ids(at)
    # Verify said where it stood (run i/n, which arm), not only a spinner: its last line stays on the page
    lines = [m.value for m in at.markdown if m.value.startswith("run ")]
    assert lines and "run 3/3" in lines[-1] and "arm **" in lines[-1], lines  # baseline, the top-1 and A/A
