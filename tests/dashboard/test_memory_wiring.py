"""The memory trade on the dashboard (issue 43 item 3): the Ablation view draws memory against time when an arm
turns a memory lever on (:func:`lab.ablation.memory_trade.carries_memory`), and the Stored runs tab finds a stored
``--memory-budget`` search and draws its tries, and the Full run tab says which memory arm fits a budget; planted
records through AppTest, nothing trains here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


def _charts(at: AppTest) -> str:
    return " ".join(el.proto.id for el in at.get("plotly_chart"))


def _ablation_view() -> None:
    import _views
    from test_memory_trade import _runs

    from lab.ablation import summarize

    runs = _runs(3)
    _views.show_ablation(summarize(runs), runs, speed="step_speedup", speed_name="step", budget_pt=1.0)


def _stored_searches(db: str) -> None:
    import page_stored_runs

    from lab import ResultStore

    with ResultStore(db) as store:
        page_stored_runs.show_budget_searches(store)


@pytest.fixture
def paths(monkeypatch):
    for p in (HERE.parent / "dashboard", HERE / "ablation"):
        monkeypatch.syspath_prepend(str(p))
    yield
    sys.modules.pop("test_memory_trade", None)


def test_the_ablation_view_draws_memory_against_time_for_memory_arms(paths):
    at = AppTest.from_function(_ablation_view, default_timeout=60).run()  # without them: carries_memory's test
    assert not at.exception and "memory_chart" in _charts(at) and "speedup_chart" in _charts(at)


def test_the_stored_runs_tab_draws_a_stored_budget_search(paths, tmp_path):
    from test_memory_trade import BASE, _run

    from lab import ResultStore
    from lab.ablation.memory_budget import fit_budget
    from lab.config import RunConfig

    found = fit_budget(RunConfig(workload="mlp", size="tiny"), 80, measure="roles",
                       measure_fn=lambda cfg: {"peak_mb": 100 / cfg.memory.micro_batches, "step_ms": 10.0})
    r = _run(BASE, 10.0)
    r.details["memory_budget"], r.config["workload"] = found, "mlp"
    db = str(tmp_path / "r.sqlite")
    with ResultStore(db) as store:
        store.add(_run(BASE, 10.0, arm="plain"), label="plain")  # not a search: not listed
        store.add(r, label="budget")
    at = AppTest.from_function(_stored_searches, args=(db,), default_timeout=60).run()
    assert not at.exception and "budget_search_chart" in _charts(at)
    assert at.selectbox(key="budget_search").value.startswith("mlp · 80 MB")


def _full_run_page() -> None:
    import page_project

    page_project.render()


def test_the_full_run_tab_says_which_memory_arm_fits_a_budget(paths, private_store):
    from test_memory_trade import _runs

    from lab import ResultStore

    with ResultStore(private_store) as store:
        for arm, rs in _runs(3).items():
            for r in rs:
                store.add(r, label=f"ablation:mem:{arm}:r{r.config['seed']}")
    at = AppTest.from_function(_full_run_page, default_timeout=60).run()
    assert not at.exception and "project_memory_chart" in _charts(at)
    at.number_input(key="project_memory_budget").set_value(60.0).run()
    said = at.code[-1].value.splitlines()
    assert said[-1].startswith("60 MB: does not fit (baseline 100 MB) -> fits at 55 MB with checkpoint_blocks, 1.30x")
    assert "(full run " in said[-1]
