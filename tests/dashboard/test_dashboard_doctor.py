"""The Doctor page driven headless through Streamlit's AppTest: it starts with instructions; **Profile and predict**
and **Verify** start doctor jobs (``lab.doctor.jobs``) through the page lifecycle, and the page draws the stored
diagnosis (breakdown chart, humanised table) and the verification; a reload draws them again from the store; a
reload during a diagnosis re-attaches to it with its stage (Cancel asks it to stop), and a click drawn before it
started joins it.

The worker is run in this process (``_lifecycle.start_worker`` replaced by a call of ``lab.doctor.jobs.run_job``,
what the worker process calls): no process is spawned, the job row and the store are the real ones."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab import (  # noqa: E402
    ResultStore,
    RunConfig,
    jobs,  # noqa: E402
)
from lab.doctor import jobs as doctor_jobs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


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


def _table(at: AppTest, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def test_doctor_page_profiles_predicts_and_verifies_in_jobs_and_redraws_after_a_reload(private_store, launched):
    at = AppTest.from_function(_page, default_timeout=120).run()
    assert not at.exception
    assert any("Profile and predict" in i.value for i in at.info)
    at.selectbox(key="doctor_workload").select("toy")
    at.selectbox(key="doctor_size").select("tiny")
    at.multiselect(key="doctor_techniques").set_value(["fused_optim", "prefetch"])
    at.button(key="doctor_run").click().run()
    assert not at.exception, at.exception
    assert launched == ["diagnose@toy/tiny/t1"]
    assert "doctor_breakdown" in _chart_ids(at) and "doctor_prescription" in _chart_ids(at)
    table = _table(at, "Technique")
    assert set(table["Technique"]) == {"fused_optim", "prefetch"}
    assert not [c for c in table.columns if "_" in c]  # named columns, no snake_case
    at.number_input(key="doctor_k").set_value(1)
    at.number_input(key="doctor_repeats").set_value(1)
    at.button(key="doctor_verify").click().run()
    assert not at.exception, at.exception
    assert launched[-1] == "verify@toy/tiny/t1" and "doctor_pvm" in _chart_ids(at)
    assert len(_table(at, "Measured (x, 95 % CI)")) == 1
    # a reload is a new session with nothing in it: the stored diagnosis and its verification are drawn again
    again = AppTest.from_function(_page, default_timeout=60).run()
    assert not again.exception, again.exception
    assert any("Showing the last diagnosis" in i.value for i in again.info), [i.value for i in again.info]
    assert again.selectbox(key="doctor_workload").value == "toy"  # the inputs show what the page shows
    assert list(_table(again, "Technique")["Technique"]) == list(table["Technique"])
    assert "doctor_pvm" in _chart_ids(again)
    assert launched == ["diagnose@toy/tiny/t1", "verify@toy/tiny/t1"]  # nothing ran again


def test_a_reload_reattaches_to_a_running_diagnosis_and_a_second_click_joins_it(private_store, launched):
    before = AppTest.from_function(_page, default_timeout=60).run()  # drawn before the job: its button enabled
    before.selectbox(key="doctor_workload").select("toy")
    before.selectbox(key="doctor_size").select("tiny").run()
    key, spec = doctor_jobs.diagnose_spec(RunConfig(workload="toy", size="tiny", threads=1), ["bf16"])
    with ResultStore(private_store) as store:  # a worker of this process, between two predictions
        token = jobs.claim(store, key, spec=spec)
        jobs.beat(store, key, token, {"stage": "predict", "arm": "bf16 (3/9)"})
    reloaded = AppTest.from_function(_page, default_timeout=60).run()
    assert not reloaded.exception, reloaded.exception
    assert any("Re-attached" in i.value for i in reloaded.info)
    assert reloaded.button(key="doctor_run").disabled
    assert any(m.value.startswith("predicting **bf16** (3/9)") for m in reloaded.markdown)
    before.button(key="doctor_run").click().run()  # a double click's race: the page, else the store's lock, decides
    assert not before.exception, before.exception
    assert launched == []
    assert any("Re-attached" in i.value or "Joined the run in progress" in i.value for i in before.info)
    assert before.button(key="doctor_run").disabled
    reloaded.button(key="doctor_cancel").click().run()  # the worker stops before its next stage
    with ResultStore(private_store) as store:
        assert [j["key"] for j in jobs.recent_jobs(store, doctor_jobs.DIAGNOSE)] == [key]
        assert jobs.job(store, key)["cancel"]
