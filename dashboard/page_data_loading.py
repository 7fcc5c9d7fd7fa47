"""Dashboard tab "Data loading": is training waiting for data? One short run of the sidebar's workload per
loader, on emulated storage (real file reads plus a per-read latency and bandwidth cap, ``lab.data.storage``).

The runs are a batch job of the background worker (:func:`lab.ablation.worker.batch_spec`, through
:mod:`_lifecycle`), like an ablation: the script never trains, a reload re-attaches to a measurement in
progress and shows its progress, a second click joins it, Cancel stops it before the next step; each run is
stored as it ends, and the page draws the finished ones.
"""

from __future__ import annotations

import _lifecycle
import _shared
import _sidebar
import streamlit as st

from lab import RunConfig, jobs
from lab.ablation.worker import batch_results, batch_spec
from lab.config import DataConfig
from lab.plots.data import loader_row, phase_bars, wait_timeline
from lab.registry import LOADERS, STORAGES

TITLE = "Data loading"
TAB = "Loading"  # the tab row's label, short so the row fits at 1280 px (_pages)
LANE = _lifecycle.DATA


def configs(workload: str, storage: str, depth: int, steps: int, loaders: list[str]) -> dict[str, RunConfig]:
    """One short tiny run per loader, on ``storage`` (what the Measure button hands the worker)."""
    out = {}
    for name in loaders:
        data = DataConfig(loader=name, storage=storage,
                          prefetch_depth=int(depth) if LOADERS[name].prefetch_depth else 2,
                          num_workers=2 if LOADERS[name].worker_processes else 0)
        out[name] = RunConfig(workload=workload, size="tiny", threads=1, max_steps=int(steps), latency_repeats=0,
                              data=data)
    return out


def _show(job: dict) -> None:
    results = batch_results(_shared.store(), job)
    samples, rows = {}, []
    for name, res in results.items():
        if res.status == "ok":
            # the measured steps (warm-up left out), the same samples for the table and both charts
            samples[name] = {phase: res.measured_ms(phase) for phase in res.step_times_ms}
            rows.append(loader_row(name, res))
        else:
            st.error(f"{name}: {res.error}")
    if samples:
        first = next(iter(job["spec"]["configs"].values()))
        hw = next(iter(results.values())).hardware_id
        st.caption(f"Workload **{first.get('workload')}** (size {first.get('size')}) on {first['data']['storage']}, "
                   f"measured on `{hw}`: {len(samples)} loader(s) (`{job['key']}`).")
        _shared.dataframe(rows, key="dl_table")
        d1, d2 = st.columns(2)
        st.caption("The median step is what a typical step pays; the share of all measured time also counts the "
                   "few long stalls (a prefetcher's empty buffer, a slow read), which a median leaves out.")
        d1.plotly_chart(phase_bars(samples, skip=0), key="dl_phases")
        d2.plotly_chart(wait_timeline(samples), key="dl_timeline")


def render() -> None:
    choices = _sidebar.current()
    store = _shared.store()
    job = _lifecycle.attached_job(store, LANE)
    running = bool(job and job["live"])
    st.markdown(f"Is training waiting for data? One short run of workload **{choices.workload}** (the sidebar's, "
                "size tiny) per loader, on emulated storage (real file reads plus a per-read latency and bandwidth "
                "cap, `lab.data.storage`).")
    dc1, dc2, dc3 = st.columns(3)
    storage = dc1.selectbox("Storage", STORAGES.names(), index=STORAGES.names().index("network_fs"),
                            key="dl_storage")
    depth = dc2.number_input("Prefetch depth (thread loader)", 1, 64, 4, key="dl_depth")
    steps = dc3.number_input("Steps per loader", 10, 2000, 40, key="dl_steps")
    # every registered loader that reads from storage (the in-memory one is the no-storage limit)
    loaders = st.multiselect("Loaders", [n for n in LOADERS.names() if n != "memory"], default=["naive", "thread"],
                             key="dl_loaders")
    b1, b2 = st.columns(2)
    go = b1.button("Measure loaders", key="dl_run", disabled=running,
                   help="disabled while a measurement runs: cancel it, or wait" if running else None)
    if running and b2.button("Cancel", key="dl_cancel", help="stops before the next training step"):
        jobs.request_cancel(store, job["key"])
    if go and not running:
        if not loaders:
            st.warning("Pick at least one loader.")
        else:
            key, spec = batch_spec("loaders", configs(choices.workload, storage, int(depth), int(steps), loaders))
            _lifecycle.start_or_join(store, key, spec, LANE)
            st.rerun()  # redraw with the button disabled and the progress of the job just started (or joined)
    if st.session_state.get(LANE.note):
        st.info(st.session_state[LANE.note])
    if job is None:
        return
    if running:
        if choices.running:
            st.caption("An ablation runs too: both share the cores, so these timings are slower than alone.")
        _lifecycle.live_progress(job["key"], _show, LANE.noun)  # each loader's figures as its run ends
        return
    _lifecycle.ended_badly(job, LANE.noun)
    _show(job)
