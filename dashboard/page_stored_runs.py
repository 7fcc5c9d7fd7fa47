"""Dashboard tab "Stored runs": any stored ablation read again (on one hardware id or all), and every stored
run as raw columns, as ``python -m lab runs`` shows them; each ``lab run --memory-budget`` search's tries, memory
against time."""

from __future__ import annotations

import _shared
import _sidebar
import _views
import streamlit as st

from lab import jobs
from lab.ablation import from_spec, load_stored, pareto_front, stored_ablations, summarize
from lab.ablation.memory_trade import carries_memory, from_ablation, stored_budget_searches
from lab.ablation.record import build_record
from lab.plots import speedup_vs_accuracy
from lab.plots.memory import memory_vs_time
from lab.plots.run import DETAIL_FIGURES

TITLE = "Stored runs"
TAB = "Runs"  # the tab row's label, short so the row fits at 1280 px (_pages)


def render() -> None:
    speed = _sidebar.current().speed
    store = _shared.store()
    names = stored_ablations(store)
    runs = store.load_runs()
    if runs.empty:
        st.caption("No runs stored yet.")
        return
    hardware = ["all", *sorted(runs["hardware_id"].dropna().unique())]
    hw = st.selectbox("Hardware", hardware, key="hw_filter")
    if names:
        name = st.selectbox("Stored ablation", names, key="stored_ablation")
        stored = load_stored(store, name, hardware_id=None if hw == "all" else hw)
        spec = (jobs.job(store, name) or {}).get("spec")  # what each arm can change, if it was kept
        if stored.get("baseline"):
            if spec:
                stored_ab = from_spec(spec)[0]
                df_stored = summarize(stored, techniques=stored_ab.techniques, axes=stored_ab.axes)
            else:
                df_stored = summarize(stored)
                st.caption("Stored before ablations kept their spec: every arm is read on every axis.")
            record = build_record(df_stored, stored)  # one source for the plot and the table
            st.markdown(_views.whose_line(record))
            st.plotly_chart(speedup_vs_accuracy(df_stored, speed=speed, front=pareto_front(df_stored, speed),
                                                record=record), key="stored_chart")
            if carries_memory(stored):  # memory arms: what their bytes cost in step time, as the Ablation tab
                st.plotly_chart(memory_vs_time(from_ablation(stored, table=df_stored)), key="stored_memory_chart")
            _views.show_table(df_stored, "stored_table", record)
            _views.show_versus(df_stored, stored, key="stored_versus")
        else:
            st.caption("This ablation has no baseline run on the chosen hardware.")
    show_budget_searches(store)
    view = runs if hw == "all" else runs[runs["hardware_id"] == hw]
    st.caption("Every stored run, newest first (raw columns, as `python -m lab runs` shows them).")
    _shared.dataframe(view.sort_values("started_at", ascending=False).head(200), key="runs", hide_index=True)


def show_budget_searches(store) -> None:  # noqa: ANN001 - the results store
    """The runs ``lab run --memory-budget`` chose, each with every configuration its search measured."""
    found = stored_budget_searches(store)
    if not found:
        return
    st.subheader("Memory budget searches")
    names = {f"{f['workload'] or '?'} · {f['budget_mb']:g} MB · {(f['started_at'] or '')[:16]} ({f['run_id'][:6]})":
             f["run_id"] for f in found}
    pick = st.selectbox("Search (`lab run --memory-budget`)", list(names), key="budget_search")
    fig = DETAIL_FIGURES["memory budget search"](store.get(names[pick]))
    if fig is not None:
        st.plotly_chart(fig, key="budget_search_chart")
