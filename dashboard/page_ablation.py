"""Dashboard tab "Ablation": the sidebar's choices as an ablation, run by the background worker
(:mod:`lab.ablation.worker`, through :mod:`_lifecycle`), its progress while it runs and, once it ends, the
verdict, figures and tables (:mod:`_views`). Pressing Run again resumes from the stored runs."""

from __future__ import annotations

import _lifecycle
import _shared
import _sidebar
import _views
import streamlit as st

from lab import RunConfig
from lab.ablation import load_stored, to_spec
from lab.recipes import RECIPES, factorial, from_techniques

TITLE = "Ablation"


def _problem(c: _sidebar.Choices) -> str | None:
    """Input checks the widgets cannot express: a message instead of a traceback."""
    if c.repeats < 1:
        return "Repeats must be at least 1."
    if c.mode == "techniques" and not c.techniques:
        return "Pick at least one technique (or switch to a recipe)."
    return None


def _start(c: _sidebar.Choices) -> None:
    problem = _problem(c)
    if problem:
        st.error(problem)
        return
    try:
        base = RunConfig(workload=c.workload, size=c.size, threads=c.threads or None, profile=c.profile)
        if c.mode == "recipe":
            ablation = RECIPES[c.recipe](base)
        elif c.as_factorial:
            ablation = factorial(base, c.techniques, name="custom_factorial")
        else:
            ablation = from_techniques("custom", base, [c.techniques])
    except ValueError as exc:
        st.error(f"Cannot build this ablation: {exc}")
        return  # the other tabs still draw
    seeds = list(range(c.n_seeds))
    _lifecycle.start_or_join(_shared.store(), ablation.key, to_spec(ablation, c.repeats, seeds))
    st.rerun()  # redraw with Run disabled and the progress of the job just started (or joined)


def _default_runs(c: _sidebar.Choices) -> int:
    """Runs of the default ablation (the ``stacked`` recipe, its A/A arm included, 3 repeats) on this workload."""
    try:
        return 3 * len(RECIPES["stacked"](RunConfig(workload=c.workload, size="tiny")).arms)
    except ValueError:
        return 30


def render() -> None:
    c = _sidebar.current()
    job = c.job
    if c.go and not c.running:
        _start(c)
    if st.session_state.get("job_note"):
        st.info(st.session_state["job_note"])
    if job is None:
        st.info(f"Pick a workload and a recipe, then press **Run ablation**. The default (stacked, tiny, 3 repeats, "
                f"{_default_runs(c)} runs on {c.workload}) takes a few minutes on 2 shared CPU cores; add a second "
                "seed for the accuracy noise band.")
        return
    if c.running:
        workload = (job.get("spec") or {}).get("baseline", {}).get("workload") or c.workload
        # the first arms' figures as they arrive; the caption names the worker's pid once it has adopted the job
        _lifecycle.live_progress(job["key"], _views.show_so_far, "ablation", f"Workload **{workload}**. ")
        return
    _lifecycle.ended_badly(job, "ablation")
    store = _shared.store()
    shown = _lifecycle.results(store, job)
    if shown is None:
        st.caption("No baseline run finished yet: nothing to compare.")
        return
    _views.fill_errors(shown[0], load_stored(store, job["key"]))
    _views.show_ablation(*shown, speed=c.speed, speed_name=_sidebar.SPEEDS[c.speed], budget_pt=c.budget_pt)

