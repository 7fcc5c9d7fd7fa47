"""The "Full run" page (issue 29) driven headless through Streamlit's AppTest: on a stored ablation it shows the
headline the seeds' way, each arm's projected full run with its interval, its parts as bars and its peak memory;
without an ablation it says what to do. Records are made by hand: nothing trains."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab import ResultStore, RunResult  # noqa: E402


def _page() -> None:
    # AppTest runs this function's source as its own script: its imports happen in here
    import sys
    from pathlib import Path

    sys.path[:0] = [str(Path.cwd() / "dashboard")]
    from page_project import render

    render()


def _record(arm: str, seed: int, step_ms: float, peak_mb: float) -> RunResult:
    steps = [40.0, 30.0] + [step_ms + 0.1 * seed] * 8
    return RunResult(run_id=f"{arm}{seed}".ljust(32, "0"), config={"seed": seed}, env={}, metric_name="auc",
                     metric=0.8 - 0.001 * seed, steps=10, warmup_steps=2, batch_size=100,
                     train_time_s=sum(steps) / 1e3 + 0.1, step_times_ms={"total": steps}, peak_memory_mb=peak_mb,
                     details={"resolved": {"steps_per_epoch": 10, "n_train": 1000, "n_test": 500, "epochs": 1},
                              "one_off_s": {"precision_probe": 0.5, "total": 0.5} if arm == "fast" else {}})


def test_full_run_page_projects_a_stored_ablation_per_arm(private_store, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    at = AppTest.from_function(_page, default_timeout=60).run()
    assert not at.exception and any("No stored ablation" in i.value for i in at.info)
    with ResultStore(private_store) as store:
        for seed in range(3):
            store.add(_record("baseline", seed, 10.0, 400.0), label=f"ablation:demo:baseline:r{seed}")
            store.add(_record("fast", seed, 5.0, 350.0), label=f"ablation:demo:fast:r{seed}")
    at = AppTest.from_function(_page, default_timeout=60).run()
    assert not at.exception, at.exception
    assert at.number_input(key="project_epochs").value == 10  # ten times the measured run, by default
    (headline,) = [*at.success, *at.info]  # a winner's line, or "the fastest arm, not a verdict (why)"
    assert "baseline " in headline.value and "-> fast " in headline.value
    assert "end to end" in headline.value and "peak memory 400 -> 350 MB" in headline.value
    table = _numbers(at.dataframe[0].value.set_index("Arm"))
    assert set(table.index) == {"baseline", "fast"}
    fast = table.loc["fast"]
    parts = fast["Training steps (s)"] + fast["Evaluations (s)"] + fast["One-off costs (s)"]
    assert fast["Full run (s, 95 % CI)"] == pytest.approx(parts, rel=1e-2)  # the bars stack to the total (3 digits)
    assert fast["lo"] <= fast["Full run (s, 95 % CI)"] <= fast["hi"] and fast["Peak memory (MB)"] == 350.0
    # the probe is the fast arm's own one-off bar (both arms pay their warm-up's excess once)
    base_once = table.loc["baseline", "One-off costs (s)"]
    assert fast["One-off costs (s)"] == pytest.approx(base_once + 0.5, rel=0.05)
    short = table.loc["baseline", "Full run (s, 95 % CI)"]
    at.number_input(key="project_epochs").set_value(20).run()  # twice the epochs: about twice the run
    longer = _numbers(at.dataframe[0].value.set_index("Arm")).loc["baseline", "Full run (s, 95 % CI)"]
    assert longer == pytest.approx(2 * short, rel=0.05)
    assert len(at.get("plotly_chart")) == 1 and len(at.get("vega_lite_chart")) == 1  # the parts (whiskers), memory


def _numbers(table):
    """The humanised table read back: "21.5 [20.8, 22.4]" -> the figure, and its interval as lo / hi."""
    import pandas as pd

    out = table.copy()
    ci = out["Full run (s, 95 % CI)"].str.extract(r"^([\d.e+-]+)(?: \[([\d.e+-]+), ([\d.e+-]+)\])?$")
    out["Full run (s, 95 % CI)"], out["lo"], out["hi"] = (pd.to_numeric(ci[i]) for i in range(3))
    for col in ("Training steps (s)", "Evaluations (s)", "One-off costs (s)", "Peak memory (MB)"):
        out[col] = pd.to_numeric(out[col])
    return out
