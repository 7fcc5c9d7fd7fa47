"""Dashboard page "Full run": a stored ablation's arms projected to the user's own run, epochs over
rows: per arm the full run with its interval, its parts as stacked bars (training steps, evaluations, one-off
costs: compile's warm-up, probe, fine-tunes, export), and its peak memory; the headline said the seeds' way. An
ablation with memory arms adds memory against time and, given a budget, which measured arm fits at what time cost
(:mod:`lab.ablation.memory_trade`, as ``python -m lab project --memory-budget MB`` says it).

Thin over :mod:`lab.ablation.project`, the same functions as ``python -m lab project``: nothing trains here, it
reads the runs an ablation (the Ablation tab, ``lab ablate``) stored.
"""

from __future__ import annotations

import _shared
import pandas as pd
import streamlit as st

from lab import jobs
from lab.ablation import from_spec, load_stored, stored_ablations, summarize, verdict
from lab.ablation.memory_trade import carries_memory, format_memory, from_ablation
from lab.ablation.project import format_projection, project_arms, projection_rows, seeds_way
from lab.plots.memory import memory_vs_time
from lab.plots.projection import full_run_bars, projection_table

TITLE = "Full run"


def render() -> None:
    """The whole page."""
    st.header("Your full run, projected")
    st.caption("From an ablation's measured runs: the mean step (and the loop's own time) x the steps of your "
               "run, plus its evaluations and the one-off costs, per arm with a 95 % interval over runs.")
    store = _shared.store()
    names = stored_ablations(store)
    if not names:
        st.info("No stored ablation yet: run one in the Ablation tab (or `python -m lab ablate`), then project it.")
        return
    name = st.selectbox("Stored ablation", names, key="project_ablation")
    runs = load_stored(store, name)
    first = next((r for r in runs.get("baseline", []) if r.status == "ok"), None)
    if first is None:
        st.info("This ablation has no finished baseline run: nothing to project from.")
        return
    resolved = first.details.get("resolved") or {}
    cols = st.columns(2)
    epochs = cols[0].number_input("epochs of your run", min_value=1, value=int(resolved.get("epochs") or 1) * 10,
                                  key="project_epochs")
    rows = cols[1].number_input("training rows", min_value=1, value=int(resolved.get("n_train") or 1),
                                key="project_rows")
    spec = (jobs.job(store, name) or {}).get("spec")
    ab = from_spec(spec)[0] if spec else None
    table = summarize(runs, techniques=ab.techniques, axes=ab.axes) if ab else summarize(runs)
    try:
        projected = project_arms(runs, epochs=int(epochs), rows=int(rows))
    except ValueError as exc:  # runs stored by another tool or an older lab: not a failure of this page
        st.info(f"This ablation cannot be projected: {exc}")
        return
    said = verdict(table)
    headline = seeds_way(table, projected, said["winner"])
    if headline and said["winner"]:
        st.success(headline)
    elif headline:  # the fastest arm is a figure, not a recommendation: the verdict says why none won
        st.info(f"The fastest arm, not a verdict ({said['text']}): {headline}")
    data, unit = projection_rows(projected, table)
    frame = pd.DataFrame(data)
    st.plotly_chart(full_run_bars(data, unit), key="project_bars")
    _shared.dataframe(projection_table(data, unit), key="project_table", hide_index=True)
    if frame["peak memory (MB)"].notna().any():
        st.subheader("Peak memory per arm (MB)")
        st.bar_chart(frame.set_index("arm")[["peak memory (MB)"]], y_label="MB")
    st.code(format_projection(projected, table), language=None)
    if carries_memory(runs):
        show_memory_budget(runs, projected, table)


def show_memory_budget(runs: dict, projected: dict, table: pd.DataFrame) -> None:
    """Each arm's measured peak against its step time, the budget as a line, and the seeds' sentence."""
    st.subheader("Memory against time")
    budget = st.number_input("memory budget (MB, by the figure's measure; 0: none)", min_value=0.0, value=0.0, step=1.0,
                             key="project_memory_budget")
    trade = from_ablation(runs, budget_mb=float(budget) or None, table=table)
    st.plotly_chart(memory_vs_time(trade), key="project_memory_chart")
    st.code(format_memory(trade, projected), language=None)
