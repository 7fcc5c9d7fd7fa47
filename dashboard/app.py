"""Streamlit dashboard: ``make dashboard`` (binds 127.0.0.1, port from PORT=, default 8501; a bare
``streamlit run dashboard/app.py`` too, through ``.streamlit/config.toml``).

Pick a workload and a recipe (or your own technique stack), press Run: the ablation runs in a background
worker process (:mod:`lab.ablation.worker`) under a per-key lock in the SQLite store (``results/lab.sqlite``),
so a reload re-attaches to it, a double click or a second tab joins it instead of starting it twice, Run is
disabled while it runs and Cancel stops it before the next step. Each finished run is stored as it ends
(pressing Run again resumes and reuses them), and the page shows which combination buys the most speed for
the least accuracy, with 95 % CIs. The app stays thin: choices come from ``lab.recipes``, numbers from
``lab.ablation``, figures and readable tables from ``lab.plots``.

Default: recipe ``stacked`` on ``ctr`` at size ``tiny``, 3 repeats (the smallest design with an interval):
9 arms (with the A/A arm) x 3 = 27 runs, about three minutes on 2 shared CPU cores (105-257 s measured by
tests/test_browser.py on a busy machine); 1 repeat is a labelled preview that crowns nothing; ``small`` with
3 repeats and 2 seeds is the meaningful one (tens of minutes on 2 cores). Built-in tabs: the ablation, stored
runs, the scaling model (``lab.distributed.scaling`` projected over link presets, with its validation band),
a data-loading explorer and the performance report (``benchmarks/results/<hardware-id>/`` or
``LAB_BENCH_RESULTS``). Then one tab per ``dashboard/page_*.py`` (``TITLE`` + ``render()``, see ``_pages``).
"""

from __future__ import annotations

import os
from pathlib import Path

import _lifecycle  # next to this file (Streamlit puts the script's folder on sys.path): the Run lifecycle
import _pages  # dashboard/page_*.py, one tab each
import _views  # the ablation table, figures and details
import streamlit as st

from lab import ResultStore, RunConfig, list_workloads, run
from lab.ablation import (
    from_spec,
    jobs,
    load_stored,
    pareto_front,
    stored_ablations,
    summarize,
)
from lab.bench import ANCHORS
from lab.config import SIZES, DataConfig
from lab.crossover.report import cross_hardware_table, load_maps
from lab.distributed.scaling import LINK_PRESETS, powers_of_two, project_band, trust
from lab.measure import environment_stamp, other_machine_note
from lab.plots import speedup_vs_accuracy
from lab.plots.data import phase_bars, wait_timeline
from lab.plots.distributed import scaling_curves
from lab.plots.report import (
    hardware_caption,
    load_reports,
    ordered_families,
    report_figure,
    report_frame,
    report_table,
)
from lab.recipes import RECIPES, TECHNIQUES, factorial, from_techniques
from lab.registry import LOADERS, STORAGES
from lab.workloads import load_spec

SPEEDS = {"train_speedup": "training (end-to-end)", "step_speedup": "training step",
          "infer_speedup": "inference (batch 256)"}

st.set_page_config(page_title="Training-efficiency lab", layout="wide")
st.title("Training-efficiency lab")
with ResultStore() as _store:
    job = _lifecycle.attached_job(_store)
running = bool(job and job["live"])
st.caption("Which combination of techniques buys the most speed for the least accuracy, on *this* machine?")

with st.sidebar:
    wl_spec = st.text_input("Add your workload", key="wl_spec", placeholder="path/to/file.py:NAME or module:NAME",
                            help="A Workload, a function returning one, or a list (README: Bring your own workload). "
                                 "LAB_WORKLOADS=SPEC[,SPEC] when starting the dashboard adds them for every session.")
    if wl_spec.strip():
        try:
            st.caption("loaded: " + ", ".join(load_spec(wl_spec.strip())))
        except ValueError as exc:
            st.error(str(exc))
    try:
        workload_names = list_workloads()
    except ValueError as exc:  # a broken LAB_WORKLOADS entry: say so, keep the built-ins usable
        st.error(str(exc))
        workload_names = ["ctr", "sequence", "vision"]
    workload = st.selectbox("Workload", workload_names, key="workload")
    size = st.selectbox("Size", SIZES, index=SIZES.index("tiny"), key="size",
                        help="tiny: seconds per run; small: under a minute per run on 2 CPU cores; full: a GPU")
    mode = st.radio("Arms", ["recipe", "techniques"], key="mode", horizontal=True)
    if mode == "recipe":
        recipe = st.selectbox("Recipe", list(RECIPES), key="recipe")
        st.caption((RECIPES[recipe].__doc__ or "").strip().splitlines()[0])
        techniques: list[str] = []
        as_factorial = False
    else:
        recipe = "custom"
        techniques = st.multiselect("Techniques", list(TECHNIQUES), default=["bf16"], key="techniques",
                                    help="; ".join(f"{t.name}: {t.description}" for t in TECHNIQUES.values()))
        as_factorial = st.checkbox("Factorial (every subset: shows interactions)", key="factorial")
    repeats = st.number_input("Repeats", min_value=0, max_value=20, value=3, step=1, key="repeats",
                              help="runs per arm and seed, interleaved; fewer than 3 runs per arm is a preview: "
                                   "no interval, no verdict")
    n_seeds = st.number_input("Seeds", min_value=1, max_value=5, value=1, step=1, key="seeds",
                              help="more seeds measure the accuracy noise band")
    threads = st.number_input("Threads (0 = torch default)", 0, 256, 1, key="threads",
                              help="fixed threads make A/B timings comparable on a shared machine")
    profile = st.checkbox("Profile each arm's steps (op-class breakdown)", key="profile",
                          help="after each run's timed steps, a few more under torch.profiler: where a step goes "
                               "(matmul, elementwise, optimizer, overhead ...) per arm in Technique details; "
                               "not used for any timing, adds a few seconds per run")
    st.subheader("Reading")
    speed = st.selectbox("Speed axis", list(SPEEDS), format_func=SPEEDS.get, key="speed")
    budget_pt = st.slider("Accuracy budget (points)", 0.0, 5.0, 1.0, 0.25, key="budget")
    go_button = st.button("Run ablation", type="primary", key="run", disabled=running,
                          help="disabled while an ablation runs: cancel it, or wait" if running else None)
    if running and st.button("Cancel", key="cancel", help="stops before the next training step; finished runs stay"):
        with ResultStore() as _store:
            jobs.request_cancel(_store, job["key"])

PAGES = _pages.discover()
tab_run, tab_stored, tab_scaling, tab_data, tab_report, *page_tabs = st.tabs(
    ["Ablation", "Stored runs", "Scaling model", "Data loading", "Performance report", *(p.title for p in PAGES)])


def _problem() -> str | None:
    """Input checks the widgets cannot express: a message instead of a traceback."""
    if repeats < 1:
        return "Repeats must be at least 1."
    if mode == "techniques" and not techniques:
        return "Pick at least one technique (or switch to a recipe)."
    return None


with tab_run:
    if go_button and not running:
        problem = _problem()
        if problem:
            st.error(problem)
        else:
            try:
                base = RunConfig(workload=workload, size=size, threads=int(threads) or None, profile=bool(profile))
                if mode == "recipe":
                    ablation = RECIPES[recipe](base)
                elif as_factorial:
                    ablation = factorial(base, techniques, name="custom_factorial")
                else:
                    ablation = from_techniques("custom", base, [techniques])
            except ValueError as exc:
                st.error(f"Cannot build this ablation: {exc}")
                st.stop()
            with ResultStore() as store:
                _lifecycle.start_or_join(store, ablation, int(repeats), list(range(int(n_seeds))))
            st.rerun()  # redraw with Run disabled and the progress of the job just started (or joined)
    if st.session_state.get("job_note"):
        st.info(st.session_state["job_note"])
    if job is None:
        st.info("Pick a workload and a recipe, then press **Run ablation**. The default (stacked, tiny, "
                "3 repeats, 27 runs) takes about three minutes on 2 shared CPU cores; add a second seed for the "
                "accuracy noise band.")
    elif running:
        st.caption(f"Ablation `{job['key']}` runs in a background worker (pid {job['pid']}): reloading this page "
                   "re-attaches to it; finished runs are stored as they end.")
        _lifecycle.live_progress(job["key"])
    else:
        if job["status"] == "cancelled":
            st.warning(f"Cancelled after {job['state'].get('done', 0)} of {job['state'].get('total', '?')} runs: "
                       "showing the finished ones (Run resumes from them).")
        elif job["status"] == "error" or (job["status"] in jobs.LIVE and not job["live"]):
            st.error(f"The ablation stopped: {job['state'].get('error') or 'its worker died without a word'}")
            if _lifecycle.worker_log_tail(job):
                st.code(_lifecycle.worker_log_tail(job), language=None)
        with ResultStore() as store:
            shown = _lifecycle.results(store, job)
            if shown is not None:
                _views.fill_errors(shown[0], load_stored(store, job["key"]))
        if shown is None:
            st.caption("No baseline run finished yet: nothing to compare.")
        else:
            _views.show_ablation(*shown, speed=speed, speed_name=SPEEDS[speed], budget_pt=budget_pt)

with tab_stored:
    with ResultStore() as store:
        names = stored_ablations(store)
        runs = store.load_runs()
    if runs.empty:
        st.caption("No runs stored yet.")
    else:
        hardware = ["all", *sorted(runs["hardware_id"].dropna().unique())]
        hw = st.selectbox("Hardware", hardware, key="hw_filter")
        if names:
            name = st.selectbox("Stored ablation", names, key="stored_ablation")
            with ResultStore() as store:
                stored = load_stored(store, name, hardware_id=None if hw == "all" else hw)
                spec = (jobs.job(store, name) or {}).get("spec")  # what each arm can change, if it was kept
            if stored.get("baseline"):
                if spec:
                    stored_ab = from_spec(spec)[0]
                    df_stored = summarize(stored, techniques=stored_ab.techniques, axes=stored_ab.axes)
                else:
                    df_stored = summarize(stored)
                    st.caption("Stored before ablations kept their spec: every arm is read on every axis.")
                st.plotly_chart(speedup_vs_accuracy(df_stored, speed=speed, front=pareto_front(df_stored, speed)),
                                key="stored_chart")
                _views.show_table(df_stored, "stored_table")
                _views.show_versus(df_stored, stored, key="stored_versus")
            else:
                st.caption("This ablation has no baseline run on the chosen hardware.")
        view = runs if hw == "all" else runs[runs["hardware_id"] == hw]
        st.caption("Every stored run, newest first (raw columns, as `python -m lab runs` shows them).")
        st.dataframe(view.sort_values("started_at", ascending=False).head(200), key="runs", hide_index=True)

def _bench_root() -> Path:
    return Path(os.environ.get("LAB_BENCH_RESULTS") or Path(__file__).resolve().parents[1] / "benchmarks" / "results")


def _measured_model_error() -> float | None:
    """The scaling model's worst held-out error (%) from the newest distributed benchmark report, if any."""
    reports, _ = load_reports(_bench_root())
    for rep in reports.values():
        for row in rep.get("rows", []):
            if "model error on unseen" in str(row.get("name")) and isinstance(row.get("value"), (int, float)):
                return abs(float(row["value"]))
    return None


with tab_scaling:
    st.markdown("How far does data parallelism scale? The α-β ring all-reduce model (`lab.distributed.scaling`) "
                "projects one worker's step onto *p* workers for each link. Calibrate α and β on this machine "
                "in notebook 05 or `benchmarks/distributed.py`.")
    sc1, sc2, sc3 = st.columns(3)
    compute_ms = sc1.number_input("Compute per step, one worker (ms)", 0.1, 100_000.0, 100.0, key="sc_compute")
    grad_mb = sc2.number_input("Gradient size (MB, fp32 params × 4)", 0.01, 100_000.0, 100.0, key="sc_grad")
    overlap = sc3.slider("Backward that hides comm", 0.0, 1.0, 0.5, 0.05, key="sc_overlap")
    links = st.multiselect("Links", list(LINK_PRESETS), default=["10GbE", "100GbE", "NVLink"], key="sc_links")
    max_p = st.select_slider("Up to workers", options=[8, 64, 256, 1024], value=256, key="sc_maxp")
    measured_error = _measured_model_error()
    model_error = st.number_input("Model's held-out error (%)", 0.0, 500.0, float(measured_error or 20.0), 1.0,
                                  key="sc_error", help="worst relative error of the fitted alpha-beta model on "
                                  "all-reduce sizes it was not fitted on; beyond +-20 % the projection is unvalidated")
    if not links:
        st.warning("Pick at least one link.")
    else:
        ps = powers_of_two(int(max_p))
        rows = {name: project_band(compute_ms / 1e3, grad_mb * 1e6, ps, LINK_PRESETS[name], model_error / 100,
                                   overlap=overlap) for name in links}
        label = trust(model_error / 100)
        (st.warning if label.startswith("unvalidated") else st.caption)(
            f"Projection {label}{' (measured by benchmarks/distributed.py)' if measured_error else ''}: the "
            "shaded band is the speedup if communication were that much faster or slower than modelled.")
        st.plotly_chart(scaling_curves(rows, rel_error=model_error / 100), key="sc_chart")
        st.dataframe([{"link": n, "workers": r["p"], "speedup (x)": f"{r['speedup']:.3g}",
                       "band (x)": f"{r['speedup_lo']:.3g} to {r['speedup_hi']:.3g}",
                       "efficiency": f"{r['efficiency']:.0%}", "all-reduce (ms)": f"{r['comm_ms']:.3g}"}
                      for n, rs in rows.items() for r in rs if r["p"] in (2, 4, 8, max_p)], key="sc_table",
                     hide_index=True)

with tab_data:
    st.markdown("Is training waiting for data? One short run of the chosen workload per loader, on emulated "
                "storage (real file reads plus a per-read latency and bandwidth cap, `lab.data.storage`).")
    dc1, dc2, dc3 = st.columns(3)
    storage = dc1.selectbox("Storage", STORAGES.names(), index=STORAGES.names().index("network_fs"),
                            key="dl_storage")
    depth = dc2.number_input("Prefetch depth (thread loader)", 1, 64, 4, key="dl_depth")
    dl_steps = dc3.number_input("Steps per loader", 10, 2000, 40, key="dl_steps")
    # every registered loader that reads from storage (the in-memory one is the no-storage limit)
    loaders = st.multiselect("Loaders", [n for n in LOADERS.names() if n != "memory"], default=["naive", "thread"],
                             key="dl_loaders")
    if st.button("Measure loaders", key="dl_run"):
        if not loaders:
            st.warning("Pick at least one loader.")
        else:
            samples, rows = {}, []
            dl_bar = st.progress(0.0, text="measuring")
            for i, name in enumerate(loaders):
                data_cfg = DataConfig(loader=name, storage=storage,
                                      prefetch_depth=int(depth) if LOADERS[name].prefetch_depth else 2,
                                      num_workers=2 if LOADERS[name].worker_processes else 0)
                res = run(RunConfig(workload=workload, size="tiny", threads=1, max_steps=int(dl_steps),
                                    latency_repeats=0, data=data_cfg), on_error="record")
                dl_bar.progress((i + 1) / len(loaders), text=f"{name}: {res.status}")
                if res.status == "ok":
                    samples[name] = res.step_times_ms
                    rows.append({"loader": name, "data wait": f"{100 * res.data_wait_fraction:.1f} %",
                                 "samples/s": round(res.throughput_samples_per_s or 0.0)})
                else:
                    st.error(f"{name}: {res.error}")
            dl_bar.empty()
            if samples:
                st.dataframe(rows, key="dl_table")
                d1, d2 = st.columns(2)
                d1.plotly_chart(phase_bars(samples), key="dl_phases")
                d2.plotly_chart(wait_timeline(samples), key="dl_timeline")

with tab_report:
    # read on every rerun (cheap: a few JSON files), so a report written while the app runs shows up
    bench_root = _bench_root()
    reports, problems = load_reports(bench_root)
    for problem in problems:
        st.warning(problem)
    if not reports:
        st.info(f"No performance report under `{bench_root}` yet: run `make bench-quick` (or "
                "`bash benchmarks/gpu.sh` on a GPU box), then reload this page.")
    else:
        st.markdown("The benchmarks' figures, each on the hardware it was measured on: ratios with bootstrap "
                    "95 % CIs against the project's goals; the anchors are other people's figures on other hardware.")
        report_rows = report_frame(reports)
        hw_ids = list(dict.fromkeys(report_rows["hardware"]))
        this_hw = environment_stamp()["hardware_id"]
        if this_hw not in hw_ids:
            st.warning(other_machine_note(", ".join(hw_ids), "The reports below",
                                          "make bench-quick (about 10 minutes)"))
        families = ordered_families(report_rows["family"])
        rc1, rc2 = st.columns(2)
        chosen_hw = rc1.multiselect("Hardware", hw_ids, default=hw_ids, key="report_hw")
        chosen_fam = rc2.multiselect("Families", families, default=families, key="report_families")
        for folder, rep in reports.items():
            if set(report_rows.loc[report_rows["folder"] == folder, "hardware"]) & set(chosen_hw):
                st.caption(hardware_caption(folder, rep))
        view = report_rows[report_rows["hardware"].isin(chosen_hw) & report_rows["family"].isin(chosen_fam)]
        if view.empty:
            st.warning("Pick at least one hardware and one family.")
        else:
            st.plotly_chart(report_figure(view), key="report_chart")
            table = report_table(view)
            st.dataframe(table, key="report_table", hide_index=True, width="stretch",
                         height=_views.table_height(len(table)),
                         column_config={"measured": st.column_config.NumberColumn(format="%.3g")})
            with st.expander("Techniques across machines (each machine's own crossover map)"):
                st.markdown(cross_hardware_table(load_maps(bench_root)))
            with st.expander("Anchors: the published figures each family is compared with"):
                for fam in ordered_families(view["family"]):
                    anchor = ANCHORS.get(fam)
                    st.markdown(f"**{fam}**: {anchor.claim} ({anchor.source})" if anchor
                                else f"**{fam}**: no anchor")

for page, tab in zip(PAGES, page_tabs, strict=True):
    with tab:
        if page.render is None:
            st.error(page.error)
        else:
            try:
                page.render()
            except Exception as exc:  # one page's bug must not blank the others
                st.error(f"{page.path.name}: {type(exc).__name__}: {exc}")
