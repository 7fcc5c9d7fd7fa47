"""Dashboard page "Where does it pay?": each technique's speedup against model size on this machine, and where
your model sits on that map.

Reads the committed map ``benchmarks/results/<hardware-id>/crossover.json`` (``LAB_CROSSOVER_JSON`` overrides;
the first ``benchmarks/results/*/crossover.json`` when this machine has none), or measures a small map on
request (two workloads, three rungs, two techniques: about a minute on 2 cores). Section "Threads" reads the
committed threads study ``crossover_threads.json`` beside it (``LAB_CROSSOVER_THREADS_JSON`` overrides): the
map at 1 thread against all cores, and loader workers against compute threads along the vision ladder.
Logic lives in :mod:`lab.crossover`, figures in :mod:`lab.plots.scale` and :mod:`lab.plots.scale_threads`;
the page is thin. Wired into ``dashboard/app.py``'s
tabs by the lead: ``from page_scale import TITLE, render``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import _shared
import streamlit as st

from lab.crossover import build_map, load_map, load_study, place, place_workload
from lab.crossover.versus import applies
from lab.doctor.rates import MAP_ENV_VAR, MAP_FILE, THREADS_ENV_VAR, THREADS_FILE, crossover_path, stored_maps
from lab.measure import other_machine_note
from lab.plots.scale import (
    crossover_figure,
    crossover_table,
    placement_table,
    reference_figure,
    regime_figure,
    utilisation_figure,
)
from lab.plots.scale_threads import technique_threads_figure, thread_scaling_figure, workers_ladder_figure
from lab.workloads import list_workloads


def _g3(x: Any) -> Any:
    """A figure (or an interval's pair) to 3 significant digits, as the table reads it; anything else as is."""
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(str(_g3(v)) for v in x) + "]"
    return f"{x:.3g}" if isinstance(x, float) else x


TITLE = "Where does it pay?"
TAB = "Where it pays"  # the tab row's label, short so the row fits at 1280 px (_pages)


def find_map(name: str = MAP_FILE, env_var: str = MAP_ENV_VAR) -> Path | None:
    """The file to show: ``$env_var``, this machine's, or the first committed one."""
    path = crossover_path(name=name, env_var=env_var)
    if path.exists() or os.environ.get(env_var):
        return path
    return next(iter(stored_maps(name=name)), None)


@st.cache_data(show_spinner=False)
def _load_study(path: str, mtime: float) -> dict[str, Any]:
    return load_study(path)


@st.cache_data(show_spinner=False)
def _load(path: str, mtime: float) -> dict[str, Any]:
    return load_map(path)


def _small_map() -> dict[str, Any]:
    return build_map(["sequence", "transformer"], ["bf16", "int8_eager"], repeats=3,
                     rungs={"sequence": ["xs", "s", "m"], "transformer": ["xs", "s", "m"]},
                     batch_size={"sequence": 32, "transformer": 16})


def render() -> None:
    the_map = _render_map()
    _render_reference(the_map)
    _render_threads()


def _render_reference(the_map: dict[str, Any] | None) -> None:
    reference = (the_map or {}).get("reference") or []
    if not reference:
        return
    st.subheader("Does the lab measure what plain PyTorch measures?")
    hw = (the_map or {}).get("env", {}).get("hardware_id", "?")
    st.caption(f"Measured on **{hw}**. On the dense ladder's largest rung the lab's arms and plain-PyTorch arms "
               "(nothing from lab: torch.optim.Adam, torch.autocast, quantize_dynamic, a half-width model) are "
               "timed in one interleaved loop; overlapping intervals mean the lab adds and hides nothing.")
    st.plotly_chart(reference_figure(reference), key="scale_reference")


def _render_threads() -> None:
    st.subheader("Threads")
    st.caption("The map at 1 thread against all cores (what the other cores buy the fp32 step, and which "
               "technique verdicts flip), and on file-backed vision whether a core given to a DataLoader worker "
               "pays more than the same core given to compute, rung by rung.")
    path = find_map(THREADS_FILE, THREADS_ENV_VAR)
    if path is None or not path.exists():
        st.info("No threads study yet: run `python benchmarks/crossover_threads.py --quick --json "
                "benchmarks/results/<hardware-id>/crossover_threads.json` (or `python -m lab threads "
                "--quick`).")
        return
    try:
        study = _load_study(str(path), path.stat().st_mtime)
    except (OSError, ValueError) as exc:
        st.error(f"{path}: not a threads study ({exc})")
        return
    comp, lad = study["comparison"], study["ladder"]
    note = other_machine_note(study.get("env", {}).get("hardware_id"), "This study's figures",
                              "python -m lab threads --quick")
    if note:
        st.warning(note)
    st.caption(f"study: `{path}` ({'quick' if study.get('quick') else 'full'} settings, "
               f"{study.get('env', {}).get('device_name')}, {study.get('cores')} cores; a shared machine)")
    st.markdown("\n".join(f"- {line.strip()}" for line in comp["headline"]))
    axis = st.radio("axis", ["train_step", "inference"], key="scale_threads_axis", horizontal=True)
    st.plotly_chart(thread_scaling_figure(study, axis), key="scale_threads_scaling")
    workloads = list(dict.fromkeys(r["workload"] for r in comp["rows"]))
    if workloads:
        wl = st.selectbox("workload", workloads, key="scale_threads_workload")
        st.plotly_chart(technique_threads_figure(study, wl, axis), key="scale_threads_techniques")
    st.markdown(f"**Loader worker or compute thread?** {lad['answer']['text']}.")
    st.plotly_chart(workers_ladder_figure(study), key="scale_threads_workers")
    _shared.dataframe([{"rung": r["rung"], "params": r["params"], "loader ms/batch": _g3(r["loader_ms_per_batch"]),
                   "compute ms/step": _g3(r["compute_ms_per_step"]), "worker / all cores": _g3(r["ratio"]),
                   "CI95": _g3(r["ci95"]), "verdict": r["verdict"],
                   "rule's pick": f"{r['rule']['threads']} thread(s) + {r['rule']['workers']} worker(s)"}
                  for r in lad["rows"]],
                 key="scale_threads_table")


def whose_map(the_map: dict[str, Any], path: Path | str) -> tuple[bool, str]:
    """(measured here?, the page's first line): whose figures these are, and how to measure this machine's."""
    hw = the_map.get("env", {}).get("hardware_id")
    note = other_machine_note(hw, f"All figures on this page (`{path}`)")
    if note:
        return False, note + " No prediction below is this machine's."
    return True, f"Measured on this machine (**{hw}**), from `{path}`."


def _render_map() -> dict[str, Any] | None:
    st.header(TITLE)
    path = find_map()
    first = st.empty()  # the page's first line: whose figures (filled once the map is known)
    st.caption("Speedup of each technique against model size, measured per machine: one training step and "
               "one inference call per rung of each workload's size ladder, arms interleaved, bootstrap 95 % CI. "
               "A star marks the measured crossover (the smallest rung whose CI lower bound is above 1).")
    if st.button("Measure a small map now (about a minute)", key="scale_run"):
        with st.spinner("measuring: sequence and transformer, rungs xs..m, bf16 and dynamic int8"):
            st.session_state["scale_map"] = _small_map()
    the_map = st.session_state.get("scale_map")
    if the_map is not None:
        first.markdown(f"Measured on this machine just now (**{the_map.get('env', {}).get('hardware_id')}**, "
                       "the small map: sequence and transformer, rungs xs..m); reload to read the committed one.")
    else:
        if path is None or not path.exists():
            first.info("No crossover map for this machine (or any other) yet: run `python -m lab crossover "
                       "--quick --json benchmarks/results/<hardware-id>/crossover.json`, or press the button below.")
            return None
        try:
            the_map = _load(str(path), path.stat().st_mtime)
        except (OSError, ValueError) as exc:
            st.error(f"{path}: not a crossover map ({exc})")
            return None
        here, line = whose_map(the_map, path)
        (first.markdown if here else first.warning)(line)
        st.caption(f"map: `{path}` ({'quick' if the_map.get('quick') else 'full'} settings, "
                   f"**{the_map['env'].get('hardware_id')}**: {the_map['env'].get('device_name')}, "
                   f"threads {the_map.get('threads', 1)}; a shared machine)")
    workloads = list(dict.fromkeys(r["workload"] for r in the_map["rows"]))
    c1, c2, c3 = st.columns(3)
    workload = c1.selectbox("workload", workloads, key="scale_workload")
    axis = c2.radio("axis", ["train_step", "inference"], key="scale_axis", horizontal=True)
    x = c3.radio("model size as", ["params", "macs"], key="scale_x", horizontal=True)
    st.subheader("Your model")
    u1, u2 = st.columns(2)
    mode = u1.radio("place", ["a workload", "numbers"], key="scale_place_mode", horizontal=True)
    placed = None
    try:
        if mode == "a workload":
            names = list_workloads()
            name = u2.selectbox("workload to place", names, key="scale_place_workload",
                                index=names.index(workload) if workload in names else 0)
            placed = place_workload(the_map, name, size="small")
        else:
            params = u2.number_input("parameters", min_value=1, value=1_000_000, step=100_000, key="scale_params")
            macs = u2.number_input("MACs per sample", min_value=1.0, value=10e6, step=1e6, key="scale_macs")
            placed = place(the_map, int(params), float(macs), workload)
    except ValueError as exc:
        st.warning(f"cannot place it: {exc}")
    user_x = None
    if placed is not None:
        cannot = [p for p in placed["predictions"] if not applies(p["technique"], p["axis"])]
        placed = {**placed, "predictions": [p for p in placed["predictions"] if p not in cannot]}
        if cannot:
            st.caption("Not predicted (the technique cannot change that axis): " + ", ".join(
                f"{p['technique']} on {p['axis'].replace('_', ' ')}" for p in cannot) + ".")
        user_x = placed["params"] if x == "params" else placed["macs_per_sample"]
        pays = [f"{p['technique']} ({p['axis'].replace('_', ' ')}, x{p['predicted_speedup']:.2f})"
                for p in placed["predictions"] if p["pays"]]
        st.markdown(f"**{placed['params']:,} parameters, {placed['macs_per_sample'] / 1e6:.3g} MMACs per sample**, "
                    f"read against the `{placed['family']}` ladder (nearest rung `{placed['nearest_rung']}`): "
                    + (("predicted to pay: " + ", ".join(pays)) if pays else "no technique is predicted to pay here."))
        _shared.dataframe(placement_table(placed["predictions"]), key="scale_predictions")
        st.caption(placed["note"])
    st.plotly_chart(crossover_figure(the_map, workload, axis, x=x, user_x=user_x), key="scale_chart")
    st.subheader("Crossovers")
    _shared.dataframe(crossover_table([c for c in the_map["crossovers"] if c["workload"] == workload]),
                      key="scale_crossovers")
    with st.expander("Regimes: why small models lose", expanded=False):
        st.plotly_chart(regime_figure(the_map, axis), key="scale_regimes")
        st.plotly_chart(utilisation_figure(the_map, axis), key="scale_utilisation")
        st.caption("A baseline at a few per cent of the peak is dispatch-bound: a technique that makes GEMMs "
                   "faster has little to speed up there. Near 100 % the step is GEMMs, and bf16 / int8 can pay up "
                   "to the card's ratio.")
    return the_map
