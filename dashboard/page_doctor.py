"""Dashboard page "Doctor": pick (or add) a workload, profile it, read the op-class breakdown and the ranked
prescription, then verify the top predictions and see predicted vs measured.

Thin over :mod:`lab.doctor` (``diagnose``, ``verify``) and :mod:`lab.plots.doctor`, the same functions as
``python -m lab doctor`` and ``notebooks/08_doctor.ipynb``. The diagnosis is kept in the session, so a rerun
of the page (any widget change) shows it again without profiling again.
"""

from __future__ import annotations

import _card
import _lifecycle
import _shared
import pandas as pd
import streamlit as st

from lab import RunConfig
from lab.config import SIZES
from lab.doctor import diagnose, format_verification, verify
from lab.doctor.risk import NOTHING_PAYS
from lab.doctor.stored import save_diagnosis
from lab.plots.doctor import op_class_bars, predicted_vs_measured, prescription_bars
from lab.registry import OPTIONS

TITLE = "Doctor"


def _diagnosis_table(d) -> pd.DataFrame:  # noqa: ANN001 - a lab.doctor.Diagnosis
    return pd.DataFrame([{"rank": i + 1, "technique": p.technique, "axis": p.axis, "predicted": round(p.speedup, 3),
                          "lo": round(p.lo, 3), "hi": round(p.hi, 3),
                          "over the run": None if p.run_speedup is None else round(p.run_speedup, 3),
                          "prescribed": p.prescribed, "reason": p.reason}
                         for i, p in enumerate(d.predictions)])


def render() -> None:
    """The whole page."""
    st.header(TITLE)
    st.caption("Profile one baseline, predict which technique pays on this machine, then check the prediction.")
    spec = st.text_input("Add your workload (spec: file.py:NAME or module:NAME)", key="doctor_spec")
    if spec:
        try:
            _shared.add_typed_workload(spec)
        except (ValueError, ImportError, OSError) as exc:
            st.error(f"cannot load {spec}: {exc}")
    cols = st.columns(3)
    workload = cols[0].selectbox("workload", _shared.workload_names(), key="doctor_workload")
    size = cols[1].selectbox("size", SIZES, index=0, key="doctor_size")
    threads = cols[2].number_input("threads", min_value=1, max_value=64, value=1, key="doctor_threads")
    techs = st.multiselect("techniques", list(OPTIONS), default=list(OPTIONS), key="doctor_techniques")
    if st.button("Profile and predict", key="doctor_run", disabled=not techs):
        try:
            cfg = RunConfig(workload=workload, size=size, threads=int(threads))
            with st.spinner("profiling a baseline and calibrating this machine's rates ..."):
                st.session_state["doctor_diagnosis"] = diagnose(cfg, techniques=techs)
            save_diagnosis(_shared.store(), st.session_state["doctor_diagnosis"])  # the card reads it after a reload
            st.session_state.pop("doctor_rows", None)
            st.rerun()  # the card above the tabs reads the new diagnosis: draw it again
        except ValueError as exc:
            st.error(str(exc))
    d = st.session_state.get("doctor_diagnosis")
    if d is None:
        st.info("Press **Profile and predict**: a short profiled run of the baseline, then one prediction per "
                "technique.")
        return
    card = _card.current()
    if card is not None and (card.workload, card.size) == (d.cfg.workload, d.cfg.size):
        st.info(f"The card above reads this diagnosis with the stored ablation: {card.headline()}")
    else:
        st.caption(f"The card above reads this diagnosis when the sidebar shows {d.cfg.workload} at size "
                   f"{d.cfg.size}.")
    bars = {"training step": d.train.to_dict()} | ({"inference": d.infer.to_dict()} if d.infer else {})
    st.plotly_chart(op_class_bars(bars), key="doctor_breakdown")
    st.caption(f"rates: {d.rate_source}; " + "; ".join(d.advice))
    st.plotly_chart(prescription_bars(d.predictions), key="doctor_prescription")
    _shared.dataframe(_diagnosis_table(d), key="doctor_table", hide_index=True)
    if d.top() is None:  # no training pick's run interval clears 1 beyond the A/A noise (lab.doctor.risk)
        st.caption(f"training step: {NOTHING_PAYS}")
    if d.skipped:
        st.caption("not predicted: " + "; ".join(f"{k} ({v})" for k, v in d.skipped.items()))
    k = st.number_input("verify the top K", min_value=1, max_value=max(1, len(d.predictions)), value=min(3, len(
        d.predictions)), key="doctor_k")
    repeats = st.number_input("repeats per arm", min_value=1, max_value=10, value=3, key="doctor_repeats")
    if st.button("Verify", key="doctor_verify"):
        # runs here, not in the worker: lab.doctor sits above lab.ablation (the worker) in the layers, so the
        # worker cannot call verify(); its ablation's job row in the store still says where it stands
        show = _lifecycle.inline_progress(_shared.store(), _lifecycle.VERIFY_PREFIX, "interleaved ablation of the "
                                          "baseline and the top predictions")
        st.session_state["doctor_rows"] = verify(d, int(k), repeats=int(repeats), store=_shared.store(),
                                                 progress=show)
    rows = st.session_state.get("doctor_rows")
    if rows:
        st.plotly_chart(predicted_vs_measured(rows), key="doctor_pvm")
        st.code(format_verification(rows), language=None)
