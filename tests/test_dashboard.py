"""The Streamlit app driven headless through Streamlit's AppTest: choose, run a tiny ablation, see the
verdict, table and charts; bad input is a message; stored ablations can be browsed again."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab import ResultStore  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


def _chart_ids(at: AppTest) -> str:
    # AppTest has no typed accessor for plotly charts (nor keys on dataframes): the element id embeds the key
    return " ".join(el.proto.id for el in at.get("plotly_chart"))


def test_app_starts_with_instructions():
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert any("Run ablation" in info.value for info in at.info)
    assert {"ctr", "sequence", "vision"} <= set(at.selectbox(key="workload").options)
    assert {"stacked", "quantization", "pruning_sweep"} <= set(at.selectbox(key="recipe").options)


def _tiny_custom(at: AppTest, techniques: list[str]) -> AppTest:
    at.selectbox(key="workload").select("sequence")
    at.selectbox(key="size").select("tiny")
    at.radio(key="mode").set_value("techniques").run()
    at.multiselect(key="techniques").set_value(techniques)
    at.number_input(key="repeats").set_value(1)
    return at


def test_run_tiny_ablation_shows_verdict_table_and_stores_runs(private_store):
    at = _tiny_custom(AppTest.from_file(APP, default_timeout=120).run(), ["prune50"])
    at.button(key="run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.success and "Best within 1 pt" in at.success[0].value
    table = at.dataframe[0].value  # the Ablation tab comes first
    assert list(table["arm"]) == ["baseline", "prune50"] and table.iloc[0]["train_speedup"] == 1.0
    assert all(k in _chart_ids(at) for k in ("pareto_chart", "speedup_chart", "phases_chart", "stored_chart"))
    at.selectbox(key="detail_arm").select("prune50").run()
    assert "detail_per-layer sparsity" in _chart_ids(at)  # the per-technique figure of the chosen arm
    with ResultStore(private_store) as store:
        assert store.count(status="ok") == 2
    # pressing Run again resumes: nothing new is trained, the stored runs are reused
    at.button(key="run").click().run()
    with ResultStore(private_store) as store:
        assert store.count() == 2
    assert "stored_ablation" in [s.key for s in at.selectbox]
    assert list(at.dataframe[1].value["arm"]) == ["baseline", "prune50"]  # the stored ablation, re-read


@pytest.mark.parametrize("bad, message", [("repeats", "Repeats must be at least 1"),
                                          ("techniques", "Pick at least one technique")])
def test_bad_input_is_a_message_not_a_traceback(bad, message):
    at = _tiny_custom(AppTest.from_file(APP, default_timeout=60).run(), ["bf16"])
    if bad == "repeats":
        at.number_input(key="repeats").set_value(0)
    else:
        at.multiselect(key="techniques").set_value([])
    at.button(key="run").click().run()
    assert not at.exception
    assert at.error and message in at.error[0].value


def test_conflicting_factorial_is_a_message():
    at = _tiny_custom(AppTest.from_file(APP, default_timeout=60).run(), ["bf16", "fp16"])
    at.checkbox(key="factorial").check()
    at.button(key="run").click().run()
    assert not at.exception
    assert at.error and "Cannot build this ablation" in at.error[0].value


def _frame_with(at, column: str):
    """The dataframe that has ``column`` (AppTest does not expose dataframe keys)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def test_scaling_model_page_projects_the_chosen_links():
    from lab.scaling_model import LINK_PRESETS, project

    at = AppTest.from_file(APP, default_timeout=60).run()
    at.multiselect(key="sc_links").set_value(["10GbE", "NVLink"]).run()
    assert not at.exception
    assert at.get("plotly_chart")
    table = _frame_with(at, "link")
    expected = project(0.1, 100e6, [8], LINK_PRESETS["10GbE"], overlap=0.5)[0]["speedup"]
    row = table[(table["link"] == "10GbE") & (table["p"] == 8)].iloc[0]
    assert row["speedup"] == pytest.approx(round(expected, 2))
    at.multiselect(key="sc_links").set_value([]).run()
    assert any("Pick at least one link" in w.value for w in at.warning)


def test_data_loading_page_measures_the_loaders():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.selectbox(key="dl_storage").select("local_ssd")
    at.number_input(key="dl_steps").set_value(10)
    at.button(key="dl_run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    table = _frame_with(at, "loader")
    assert list(table["loader"]) == ["naive", "thread"]
