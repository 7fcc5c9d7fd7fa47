"""What the Ablation and Stored-runs tabs draw for one ablation table: the verdict, the figures one under
the other (a half-width column cuts titles and squashes bars), the humanised table and the "why" as
sentences, the factorial effects, and each family's details for the chosen arm (selection kept across
reruns by its widget key; no expander, which collapsed on every selection), and what this machine's
crossover map predicted for each arm beside what the ablation measured (:func:`show_versus`)."""

from __future__ import annotations

import json
from typing import Any

import _shared
import streamlit as st

from lab import crossover
from lab.ablation import interaction_effects, load_ablation, pareto_front, summarize
from lab.ablation.memory_trade import carries_memory, from_ablation
from lab.ablation.project import measured_arms, seeds_way
from lab.ablation.record import AblationRecord, build_record
from lab.ablation.runner import from_spec
from lab.crossover.versus import AXIS_COLUMN
from lab.doctor.rates import crossover_path
from lab.measure import environment_stamp
from lab.plots import (
    ablation_table,
    effects_table,
    phase_breakdown,
    speedup_bars,
    speedup_vs_accuracy,
    technique_figures,
    technique_notes,
)
from lab.plots.memory import memory_vs_time
from lab.plots.tables import why_lines
from lab.plots.versus import versus_figure, versus_table

#: Overrides the map (the same variable the "Where does it pay?" page reads).


def table_height(n_rows: int, cap: int = 720) -> int:
    """Pixels that show every row of a dataframe (a scroll bar only beyond ``cap``)."""
    return min(38 + 35 * max(n_rows, 1), cap)


def show_table(df, key: str, record: AblationRecord | None = None) -> None:
    _shared.dataframe(ablation_table(df, record), key=key, hide_index=True, width="stretch",
                 height=table_height(len(df)))


def fill_errors(df, stored: dict) -> None:
    """The Ablation tab rebuilds its table from the finished (ok) runs only, so an arm that never ran (refused
    by a capability gate, or failed) has no message there: take it from that arm's stored error runs
    (``lab.ablation.load_stored``), so the arm says why instead of "None"."""
    for i, row in df.iterrows():
        if row["status"] == "error" and not isinstance(row.get("error"), str):
            errors = sorted({r.error for r in stored.get(row["arm"], []) if r.status != "ok" and r.error})
            if errors:
                df.at[i, "error"] = "; ".join(errors)


def whose_line(record: AblationRecord) -> str:
    """The first line under an ablation: the workload it measured and the machine it was measured on."""
    mine = environment_stamp()["hardware_id"]
    hw = ", ".join(f"`{h}`" for h in record.hardware_ids) or "an unknown machine"
    where = "this machine" if record.hardware_ids == (mine,) else f"**not this machine** (this one is `{mine}`)"
    at = next((a.batch for a in record.arms.values() if a.batch), None)
    return (f"Workload **{record.workload or '?'}**, measured on {hw}: {where}."
            + (f" Inference figures at batch {at}." if at else ""))


def show_ablation(df, runs_by_arm: dict | None, *, speed: str, speed_name: str, budget_pt: float) -> None:
    record = build_record(df, runs_by_arm)  # every figure below is read from it
    st.markdown(whose_line(record))
    said = record.verdict(budget_pt, speed=speed)
    (st.success if said["winner"] else st.warning)(f"Verdict on {speed_name}: {said['text']}")
    e2e = seeds_way(df, measured_arms(runs_by_arm or {}), said["winner"])  # the user's unit (a whole run) first
    if e2e and said["winner"]:
        st.markdown(f"**End to end** (training + evaluations + one-off costs, measured): {e2e}")
    elif e2e:  # the fastest arm, said as what it is: a figure, not a recommendation (it lost to noise or a busy box)
        st.markdown(f"**End to end, the fastest arm** (measured; not a verdict: see the verdict above): {e2e}")
    st.caption("An arm competes only on the axes its techniques can change (post-training int8 and pruning: "
               "inference and size; precision, loaders, compile: training); the A/A arm reruns the baseline "
               "and shows the noise floor. Hover a point or a bar for its interval and why.")
    not_run = [a.arm for a in record.arms.values() if a.not_run]
    if not_run:
        st.info(f"Not run (the ablation stopped before them): {', '.join(not_run)}. Press Run to resume.")
    for arm in record.arms.values():
        if arm.refused:
            st.info(f"Arm {arm.arm} does not apply here (refused before training): {arm.refused}")
        elif arm.status == "error" and not arm.not_run:
            st.error(f"Arm {arm.arm} failed: {arm.error or 'no message stored'}")
        elif arm.status == "partial":
            st.warning(f"Arm {arm.arm}: {arm.n_ok} of {arm.n_runs} runs finished; the others failed: {arm.error}")
    st.plotly_chart(speedup_vs_accuracy(df, speed=speed, front=pareto_front(df, speed), budget_pt=budget_pt,
                                        record=record), key="pareto_chart")
    st.plotly_chart(speedup_bars(df, record=record), key="speedup_chart")
    if runs_by_arm and carries_memory(runs_by_arm):  # a memory arm: what its bytes cost in step time
        st.plotly_chart(memory_vs_time(from_ablation(runs_by_arm, table=df)), key="memory_chart")
    show_table(df, "ablation_table", record)
    lines = why_lines(df, record)
    if lines:
        st.markdown("**Why** (what the measurements say about each arm)\n\n" + "\n".join(f"- {w}" for w in lines))
    effects = interaction_effects(df, speed=speed)
    if not effects.empty:
        st.subheader("Do they compound or cancel?")
        st.caption("Factorial effects on the speed axis with 95 % intervals: main effects (one arm against the "
                   "baseline: faster or slower), 2-way and 3-way terms (compound or cancel).")
        _shared.dataframe(effects_table(effects), key="interactions", hide_index=True, width="stretch",
                     height=table_height(len(effects)))
    show_versus(df, runs_by_arm)
    if runs_by_arm:
        show_details(runs_by_arm, record)
    st.download_button("Download CSV (every column, full precision)", df.to_csv(index=False),
                       file_name="ablation.csv", mime="text/csv", key="download")


@st.cache_resource(show_spinner=False, max_entries=4)
def _so_far(store_path: str, key: str, done: int, spec_json: str) -> tuple[Any, dict, int] | None:
    """(table, runs, arms that ran) of a running ablation after ``done`` runs, built once per finished run
    (the figures fragment redraws every ``_lifecycle.FIGURES_S`` seconds; the store is read again only when a run
    was added)."""
    ablation, repeats, seeds = from_spec(json.loads(spec_json))
    runs = load_ablation(ablation, _shared.store(), repeats, seeds)
    if not runs.get("baseline"):
        return None
    df = summarize(runs, techniques=ablation.techniques, axes=ablation.axes)
    return df, runs, sum(1 for rs in runs.values() if rs)


def show_so_far(job: dict[str, Any]) -> None:
    """While an ablation runs: the figures of the arms that have finished runs, as they arrive ("n of m arms"),
    read from the same record as the final view; no verdict until every run is in (a partial design is not
    interleaved over its last rounds yet, so its intervals are wider and its order effects unbalanced)."""
    state = job.get("state") or {}
    done, total = int(state.get("done") or 0), int(state.get("total") or 0)
    found = _so_far(str(_shared.store().path), job["key"], done, _json(job["spec"])) if done else None
    if found is None:
        n_arms = len(from_spec(job["spec"])[0].arms)
        st.caption(f"Figures so far: none yet (0 of {n_arms} arms; the baseline's first run comes first).")
        return
    df, runs, ran = found
    record = build_record(df, runs)
    st.markdown(f"**Figures so far: {ran} of {len(runs)} arms** have a finished run ({done} of {total} runs). "
                "Intervals tighten as repeats arrive; the verdict comes when every run is in.")
    st.plotly_chart(speedup_bars(df, record=record), key="so_far_chart")
    show_table(df, "so_far_table", record)


def _json(spec: Any) -> str:
    return json.dumps(spec, sort_keys=True)


def show_details(runs_by_arm: dict, record: AblationRecord | None = None) -> None:
    firsts = {arm: next((r for r in rs if r.status == "ok"), None) for arm, rs in runs_by_arm.items()}
    firsts = {a: r for a, r in firsts.items() if r is not None}
    if not firsts:
        return
    st.plotly_chart(phase_breakdown(list(firsts.values()), labels=list(firsts)), key="phases_chart")
    st.subheader("Technique details")
    arm = st.selectbox("Arm", list(firsts), key="detail_arm",
                       help="each family's own figures for this arm's first finished run")
    result = firsts[arm]
    rec = record.arms.get(arm) if record is not None else None
    notes = technique_notes(result, rec)
    if notes:
        st.markdown("\n".join(f"- {n}" for n in notes))
    figs = technique_figures(result, rec)
    if not figs and not notes:
        st.caption("Nothing technique-specific to show for this arm (the baseline trains plain fp32).")
    for name, fig in figs.items():
        st.plotly_chart(fig, key=f"detail_{name}")


def this_machine_map() -> tuple[dict[str, Any] | None, str]:
    """(this hardware id's crossover map or None, where it was looked for or why it is unusable). Only this
    machine's map: another machine's predictions say nothing about the speedups measured here."""
    hw = environment_stamp()["hardware_id"]
    path = crossover_path()  # this machine's map, or $LAB_CROSSOVER_JSON's
    if not path.exists():
        return None, (f"No crossover map for this hardware id ({hw}) at `{path}`: run `python -m lab crossover "
                      f"--quick --json {path}` to see the map's predictions beside these measurements.")
    try:
        return _load_map(str(path), path.stat().st_mtime), f"`{path}`"
    except (OSError, ValueError) as exc:
        return None, f"`{path}` is not a crossover map ({exc}): no predictions to compare."


@st.cache_data(show_spinner=False)
def _load_map(path: str, mtime: float) -> dict[str, Any]:
    return crossover.load_map(path)


@st.cache_data(show_spinner=False)
def _versus_rows(path_note: str, rows: list[dict[str, Any]], workload: str, size: str,
                 model_scale: str | None) -> list[dict[str, Any]]:
    the_map, _ = this_machine_map()
    return crossover.predicted_vs_measured(the_map, rows, workload, size=size, model_scale=model_scale)


def show_versus(df, runs_by_arm: dict | None, key: str = "versus") -> None:
    """The map's predicted speedup per arm and axis (at the ablation's model size) against the
    measured one with its CI; one line instead when there is no map, no ladder or no arm the map knows."""
    st.subheader("Predicted by the map vs measured")
    base = next(iter((runs_by_arm or {}).get("baseline") or []), None)
    cfg = (base.config if base is not None else None) or {}
    if not cfg.get("workload"):
        st.info("No baseline run to read the workload from: nothing to place on the crossover map.")
        return
    the_map, where = this_machine_map()
    if the_map is None:
        st.info(where)
        return
    cols = ["arm", *[c + s for c in AXIS_COLUMN.values() for s in ("", "_lo", "_hi")]]
    rows = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
            for r in df[[c for c in cols if c in df.columns]].to_dict("records")]
    try:
        # a user's model by its spec (file.py:NAME), so a process that has not loaded it yet can place it too
        found = _versus_rows(where, rows, cfg.get("workload_spec") or cfg["workload"], cfg.get("size") or "small",
                             cfg.get("model_scale"))
    except Exception as exc:  # noqa: BLE001 - a prediction that cannot be made must not hide the ablation
        st.info(f"The map cannot place `{cfg['workload']}`: {exc}")
        return
    # only the axes an arm competes on (a precision arm's inference runs in fp32; a refused arm has none)
    competes = {a: str(x).split(",") for a, x in zip(df["arm"], df.get("axes", [""] * len(df)), strict=True)}
    found = [r for r in found if r["axis"] in competes.get(r["arm"], [])]
    if not found:
        known = ", ".join(sorted({r["technique"] for r in the_map.get("rows") or []}))
        st.info(f"No arm of this ablation has a row of the same name on the map (the techniques it times: {known}).")
        return
    st.caption(f"Map {where}, read at this workload's model size (size `{cfg.get('size')}`"
               + (f", scale `{cfg['model_scale']}`" if cfg.get("model_scale") else "") + "). Agrees: the "
               "predicted speedup lies inside the measured 95 % CI. The map's fits are per step at its ladder's "
               "batch, so a different batch moves the fixed overhead's share.")
    st.plotly_chart(versus_figure(found), key=f"{key}_chart")
    table = versus_table(found)
    _shared.dataframe(table, key=f"{key}_table", hide_index=True, width="stretch", height=table_height(len(table)))
