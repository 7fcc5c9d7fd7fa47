"""Dashboard page "Doctor": pick (or add) a workload, profile it, read the op-class breakdown and the ranked
prescription, then verify the top predictions and see predicted vs measured.

Thin over :mod:`lab.doctor.jobs`: **Profile and predict** and **Verify** start background jobs (the worker
process runs :func:`~lab.doctor.diagnosis.diagnose` and :func:`~lab.doctor.verification.verify_predictions`, the
same functions as ``python -m lab doctor``), through :mod:`_lifecycle` as the Ablation tab's runs: the page shows
their progress, a reload re-attaches to the one that runs, a second click joins it. The diagnosis is stored
(:mod:`lab.doctor.stored`): the page draws it from the store, and the recommendation card above the tabs reads
the same row. Figures and tables from :mod:`lab.plots.doctor`.
"""

from __future__ import annotations

from typing import Any

import _card
import _lifecycle
import _shared
import streamlit as st

from lab import ResultStore, RunConfig, jobs
from lab.config import SIZES
from lab.doctor import BUSY_REFUSAL
from lab.doctor.jobs import diagnose_spec, verify_spec
from lab.doctor.risk import NOTHING_PAYS
from lab.doctor.stored import StoredDiagnosis, diagnosis_by_id
from lab.doctor.verification import summary_lines
from lab.plots.doctor import (
    diagnosis_table,
    op_class_bars,
    predicted_vs_measured,
    prescription_bars,
    verification_table,
)
from lab.registry import OPTIONS

TITLE = "Doctor"
LANE, VERIFY = _lifecycle.DOCTOR, _lifecycle.VERIFY


def _index(options: list[Any], value: Any) -> int:
    return options.index(value) if value in options else 0


def _last_done(store: ResultStore, lane: _lifecycle.Lane, **spec: Any) -> dict[str, Any] | None:
    """The newest job of the lane that ended ``done`` (and whose spec has ``spec``'s values)."""
    return next((j for j in jobs.recent_jobs(store, lane.kind) if j["status"] == "done"
                 and all((j["spec"] or {}).get(k) == v for k, v in spec.items())), None)


def _diagnosis(store: ResultStore) -> StoredDiagnosis | None:
    """The diagnosis the page shows: the one the newest finished diagnosis job stored."""
    done = _last_done(store, LANE)
    did = (done or {}).get("state", {}).get("diagnosis")
    return diagnosis_by_id(store, did) if did is not None else None


def _choose(job: dict[str, Any] | None) -> tuple[str, str, int, list[str]]:
    """The workload, size, threads and techniques inputs, first drawn with the attached job's (so a reload shows
    what it profiles), then the user's."""
    asked = (job or {}).get("spec") or {}
    cfg = asked.get("config") or {}
    names = _shared.workload_names()
    cols = st.columns(3)
    workload = cols[0].selectbox("workload", names, index=_index(names, cfg.get("workload")), key="doctor_workload")
    size = cols[1].selectbox("size", SIZES, index=_index(list(SIZES), cfg.get("size")), key="doctor_size")
    threads = cols[2].number_input("threads", min_value=1, max_value=64, value=int(cfg.get("threads") or 1),
                                   key="doctor_threads")
    picked = [t for t in (asked.get("techniques") or OPTIONS) if t in OPTIONS]
    techs = st.multiselect("techniques", list(OPTIONS), default=picked, key="doctor_techniques")
    return workload, size, int(threads), techs


def render() -> None:
    """The whole page."""
    st.header(TITLE)
    st.caption("Profile one baseline, predict which technique pays on this machine, then check the prediction. "
               "Both run in a background worker: a reload re-attaches to them, and the diagnosis is stored (the "
               "card above reads it).")
    spec = st.text_input("Add your workload (spec: file.py:NAME or module:NAME)", key="doctor_spec")
    if spec:
        try:
            _shared.add_typed_workload(spec)
        except (ValueError, ImportError, OSError) as exc:
            st.error(f"cannot load {spec}: {exc}")
    store = _shared.store()
    job = _lifecycle.attached_job(store, LANE)
    running = bool(job and job["live"])
    workload, size, threads, techs = _choose(job)
    if st.session_state.get(LANE.note):
        st.info(st.session_state[LANE.note])
    b1, b2 = st.columns(2)
    if running and b2.button("Cancel", key="doctor_cancel", help="stops before the next stage or training step"):
        jobs.request_cancel(store, job["key"])
    if b1.button("Profile and predict", key="doctor_run", disabled=running or not techs,
                 help="disabled while a diagnosis runs: cancel it, or wait" if running else None) and not running:
        try:
            key, job_spec = diagnose_spec(RunConfig(workload=workload, size=size, threads=threads), techs)
        except ValueError as exc:
            st.error(str(exc))
        else:
            _lifecycle.start_or_join(store, key, job_spec, LANE)
            st.rerun()  # redraw with the button disabled and the diagnosis's stage
    if running:
        _lifecycle.live_progress(job["key"], None, LANE.noun)  # profiling, calibrating, predicting bf16 (3/9)
        return
    if job is not None:
        _lifecycle.ended_badly(job, LANE.noun)
    d = _diagnosis(store)
    if d is None:
        st.info("Press **Profile and predict**: a short profiled run of the baseline, then one prediction per "
                "technique.")
        return
    _show(d)
    _verification(store, d)


def _show(d: StoredDiagnosis) -> None:
    st.subheader(f"{d.cfg.workload} at size {d.cfg.size}, {d.cfg.threads or 1} thread(s): diagnosed "
                 f"{d.age_text()}")
    card = _card.current()
    if card is not None and (card.workload, card.size) == (d.cfg.workload, d.cfg.size):
        st.info(f"The card above reads this diagnosis with the stored ablation: {card.headline()}")
    else:
        st.caption(f"The card above reads this diagnosis when the sidebar shows {d.cfg.workload} at size "
                   f"{d.cfg.size}.")
    bars = ({"training step": d.train} if d.train else {}) | ({"inference": d.inference} if d.inference else {})
    if bars:
        st.plotly_chart(op_class_bars(bars), key="doctor_breakdown")
    st.caption(f"rates: {d.rate_source}; " + "; ".join(d.advice))
    st.plotly_chart(prescription_bars(d.predictions), key="doctor_prescription")
    _shared.dataframe(diagnosis_table(d.predictions), key="doctor_table", hide_index=True)
    if d.busy:  # the baseline's step carried other processes' time: nothing prescribed (lab.doctor.diagnosis)
        st.warning(f"training step: nothing prescribed: {BUSY_REFUSAL} ({d.busy})")
    elif d.top() is None:  # no training pick surely enough faster beyond the A/A noise (lab.doctor.risk)
        st.caption(f"training step: {NOTHING_PAYS}")
    if d.skipped:
        st.caption("not predicted: " + "; ".join(f"{k} ({v})" for k, v in d.skipped.items()))


def _verification(store: ResultStore, d: StoredDiagnosis) -> None:
    """Verify the shown diagnosis in the background; its predicted vs measured once it ends."""
    if not d.predictions:
        return
    job = _lifecycle.attached_job(store, VERIFY)
    running = bool(job and job["live"])
    k = st.number_input("verify the top K", min_value=1, max_value=len(d.predictions),
                        value=min(3, len(d.predictions)), key="doctor_k")
    repeats = st.number_input("repeats per arm", min_value=1, max_value=10, value=3, key="doctor_repeats")
    b1, b2 = st.columns(2)
    if running and b2.button("Cancel", key="doctor_verify_cancel", help="stops before the next training step"):
        jobs.request_cancel(store, job["key"])
    if b1.button("Verify", key="doctor_verify", disabled=running,
                 help="disabled while a verification runs: cancel it, or wait" if running else None) and not running:
        try:
            key, spec = verify_spec(d, int(k), int(repeats))
        except ValueError as exc:
            st.error(str(exc))
        else:
            _lifecycle.start_or_join(store, key, spec, VERIFY)
            st.rerun()
    if running:
        if st.session_state.get(VERIFY.note):
            st.info(st.session_state[VERIFY.note])
        _lifecycle.live_progress(job["key"], None, VERIFY.noun)  # run i/n, arm, step, time left
        return
    if job is not None and (job["spec"] or {}).get("diagnosis") == d.id:
        _lifecycle.ended_badly(job, VERIFY.noun)
    done = _last_done(store, VERIFY, diagnosis=d.id)
    rows = (done or {}).get("state", {}).get("rows")
    if rows:
        st.plotly_chart(predicted_vs_measured(rows), key="doctor_pvm")
        _shared.dataframe(verification_table(rows), key="doctor_verified", hide_index=True)
        for line in summary_lines(rows):
            st.caption(line)
