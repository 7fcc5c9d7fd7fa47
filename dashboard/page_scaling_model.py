"""Dashboard tab "Scaling model": how far data parallelism scales, the alpha-beta ring all-reduce model
(:mod:`lab.distributed.scaling`) projected over link presets, with the band of its measured validation error."""

from __future__ import annotations

import _shared
import _sidebar
import streamlit as st

from lab.distributed.scaling import LINK_PRESETS, powers_of_two, project_band, step_of_stored_run, trust
from lab.plots.distributed import scaling_curves
from lab.plots.report import load_reports

TITLE = "Scaling model"
TAB = "Scaling"  # the tab row's label, short so the row fits at 1280 px (_pages)


def measured_model_error() -> float | None:
    """The scaling model's worst held-out error (%) from the newest distributed benchmark report, if any."""
    reports, _ = load_reports(_shared.bench_root())
    for rep in reports.values():
        for row in rep.get("rows", []):
            if "model error on unseen" in str(row.get("name")) and isinstance(row.get("value"), (int, float)):
                return abs(float(row["value"]))
    return None


def render() -> None:
    st.markdown("How far does data parallelism scale? The α-β ring all-reduce model (`lab.distributed.scaling`) "
                "projects one worker's step onto *p* workers for each link. Calibrate α and β on this machine "
                "in notebook 05 or `benchmarks/distributed.py`.")
    c = _sidebar.current()
    stored = step_of_stored_run(_shared.store(), c.workload, c.size)
    if stored:
        st.caption(f"Defaults from the sidebar's workload: {stored['said']}.")
    else:
        st.caption(f"No stored single-process fp32 run of {c.workload} at size {c.size}: generic defaults (run it "
                   "once, e.g. the Ablation tab's baseline, and this page starts from its step and its gradient).")
    sc1, sc2, sc3 = st.columns(3)
    at = f"{c.workload}_{c.size}"  # per workload and size: another sidebar choice starts from its own run
    compute_ms = sc1.number_input("Compute per step, one worker (ms)", 0.001, 100_000.0,
                                  float(stored["compute_ms"]) if stored else 100.0, key=f"sc_compute_{at}")
    grad_mb = sc2.number_input("Gradient size (MB, fp32 params × 4)", 0.0001, 100_000.0,
                               float(stored["grad_mb"]) if stored else 100.0, key=f"sc_grad_{at}", format="%.4g")
    overlap = sc3.slider("Backward that hides comm", 0.0, 1.0, 0.5, 0.05, key="sc_overlap")
    links = st.multiselect("Links", list(LINK_PRESETS), default=["10GbE", "100GbE", "NVLink"], key="sc_links")
    max_p = st.select_slider("Up to workers", options=[8, 64, 256, 1024], value=256, key="sc_maxp")
    measured_error = measured_model_error()
    model_error = st.number_input("Model's held-out error (%)", 0.0, 500.0, float(measured_error or 20.0), 1.0,
                                  key="sc_error", help="worst relative error of the fitted alpha-beta model on "
                                  "all-reduce sizes it was not fitted on; beyond +-20 % the projection is unvalidated")
    if not links:
        st.warning("Pick at least one link.")
        return
    ps = powers_of_two(int(max_p))
    rows = {name: project_band(compute_ms / 1e3, grad_mb * 1e6, ps, LINK_PRESETS[name], model_error / 100,
                               overlap=overlap) for name in links}
    label = trust(model_error / 100)
    (st.warning if label.startswith("unvalidated") else st.caption)(
        f"Projection {label}{' (measured by benchmarks/distributed.py)' if measured_error else ''}: the "
        "shaded band is the speedup if communication were that much faster or slower than modelled.")
    st.plotly_chart(scaling_curves(rows, rel_error=model_error / 100), key="sc_chart")
    _shared.dataframe([{"link": n, "workers": r["p"], "speedup (x)": f"{r['speedup']:.3g}",
                   "band (x)": f"{r['speedup_lo']:.3g} to {r['speedup_hi']:.3g}",
                   "efficiency": f"{r['efficiency']:.0%}", "all-reduce (ms)": f"{r['comm_ms']:.3g}"}
                  for n, rs in rows.items() for r in rs if r["p"] in (2, 4, 8, max_p)], key="sc_table",
                 hide_index=True)
