"""The sidebar: the workload, the ablation's arms and repeats, how to read the table, Run and Cancel.

Drawn once per rerun by ``app.py`` before the tabs (:func:`draw`); a page reads what it needs from
:func:`current`: the choices and the ablation job the sidebar saw (one snapshot, so Run's disabled state and
the Ablation tab never disagree about whether a job runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import _lifecycle
import _shared
import streamlit as st

from lab import jobs
from lab.config import SIZES
from lab.recipes import RECIPES
from lab.registry import OPTIONS

SPEEDS = {"train_speedup": "training (end-to-end)", "step_speedup": "training step",
          "infer_speedup": "inference (batch 256)"}
_STATE = "_sidebar_choices"


@dataclass(frozen=True)
class Choices:
    workload: str
    size: str
    mode: str
    recipe: str
    techniques: list[str]
    as_factorial: bool
    repeats: int
    n_seeds: int
    threads: int
    profile: bool
    speed: str
    budget_pt: float
    go: bool  # Run was pressed in this rerun
    job: dict[str, Any] | None  # the ablation job this session shows

    @property
    def running(self) -> bool:
        return bool(self.job and self.job["live"])


def _first_sentence(doc: str) -> str:
    """A recipe's docstring up to its first full stop, on one line (its first line stopped mid-sentence)."""
    text = " ".join(doc.split()).replace("``", "")
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _follow_job(job: dict[str, Any] | None, workload_names: list[str]) -> None:
    """A new session (a reload, a second tab) that re-attaches to a job opens its sidebar on that job's workload
    and size, so the sidebar says what the page shows (it said ctr over a sequence ablation). A session that has
    its own choices keeps them."""
    base = (job or {}).get("spec") or {}
    base = base.get("baseline") or {} if isinstance(base, dict) else {}
    if "workload" not in st.session_state and base.get("workload") in workload_names:
        st.session_state["workload"] = base["workload"]
    if "size" not in st.session_state and base.get("size") in SIZES:
        st.session_state["size"] = base["size"]


def draw() -> Choices:
    """The sidebar's widgets; their choices for this rerun (remembered for :func:`current`)."""
    store = _shared.store()
    job = _lifecycle.attached_job(store)
    running = bool(job and job["live"])
    with st.sidebar:
        # drawn in this order (the containers), filled in another: Run sits under the arms, inside the first
        # 800 px, and the typed workload (read first, so the list below already has it) comes last
        arms_box, run_box, options_box, own_box = st.container(), st.container(), st.container(), st.container()
    with own_box:
        wl_spec = st.text_input("Add your workload", key="wl_spec", placeholder="file.py:NAME or module:NAME",
                                help="A Workload, a function returning one, or a list (docs/workloads.md: Bring "
                                     "your own workload). LAB_WORKLOADS=SPEC[,SPEC] when starting the dashboard "
                                     "adds them for every session.")
        if wl_spec.strip():
            try:
                st.caption("loaded for this browser tab: " + ", ".join(_shared.add_typed_workload(wl_spec.strip())))
            except (ValueError, ImportError, OSError) as exc:
                st.error(str(exc))
        try:
            workload_names = _shared.workload_names()
        except ValueError as exc:  # a broken LAB_WORKLOADS entry: say so, keep the built-ins usable
            st.error(str(exc))
            workload_names = ["ctr", "sequence", "vision"]
    _follow_job(job, workload_names)
    with arms_box:
        workload = st.selectbox("Workload", workload_names, key="workload")
        size = st.selectbox("Size", SIZES, key="size", **({} if "size" in st.session_state else {"index": SIZES.index(
                            "tiny")}),
                            help="tiny: seconds per run; small: under a minute per run on 2 CPU cores; full: a GPU")
        mode = st.radio("Arms", ["recipe", "techniques"], key="mode", horizontal=True)
        if mode == "recipe":
            recipe = st.selectbox("Recipe", list(RECIPES), key="recipe")
            st.caption(_first_sentence(RECIPES[recipe].__doc__ or ""))
            techniques: list[str] = []
            as_factorial = False
        else:
            recipe = "custom"
            techniques = st.multiselect("Techniques", list(OPTIONS), default=["bf16"], key="techniques",
                                        help="; ".join(f"{t.name}: {t.description}" for t in OPTIONS.values()))
            as_factorial = st.checkbox("Factorial (every subset: shows interactions)", key="factorial")
    with options_box:
        st.subheader("Design")
        repeats = st.number_input("Repeats", min_value=0, max_value=20, value=3, step=1, key="repeats",
                                  help="runs per arm and seed, interleaved; fewer than 3 runs per arm is a preview: "
                                       "no interval, no verdict")
        n_seeds = st.number_input("Seeds", min_value=1, max_value=5, value=1, step=1, key="seeds",
                                  help="more seeds measure the accuracy noise band")
        threads = st.number_input("Threads (0 = torch default)", 0, 256, 1, key="threads",
                                  help="fixed threads make A/B timings comparable on a shared machine")
        profile = st.checkbox("Profile each arm's steps (op-class breakdown)", key="profile",
                              help="after each run's timed steps, a few more under torch.profiler: where a step "
                                   "goes (matmul, elementwise, optimizer, overhead ...) per arm in Technique "
                                   "details; not used for any timing, adds a few seconds per run")
        st.subheader("Reading")
        speed = st.selectbox("Speed axis", list(SPEEDS), format_func=SPEEDS.get, key="speed")
        budget_pt = st.slider("Accuracy budget (points)", 0.0, 5.0, 1.0, 0.25, key="budget")
    with run_box:
        go = st.button("Run ablation", type="primary", key="run", disabled=running,
                       help="disabled while an ablation runs: cancel it, or wait" if running else None)
        if running and st.button("Cancel", key="cancel",
                                 help="stops before the next training step; finished runs stay"):
            jobs.request_cancel(store, job["key"])
    choices = Choices(workload=workload, size=size, mode=mode, recipe=recipe, techniques=list(techniques),
                      as_factorial=bool(as_factorial), repeats=int(repeats), n_seeds=int(n_seeds),
                      threads=int(threads), profile=bool(profile), speed=speed, budget_pt=float(budget_pt),
                      go=bool(go), job=job)
    st.session_state[_STATE] = choices
    return choices


def current() -> Choices:
    """This rerun's choices (the sidebar ``app.py`` drew); a page rendered on its own draws the sidebar
    here (once per rerun: call it once, at the top of ``render()``), remembering nothing for the next."""
    found = st.session_state.get(_STATE)
    if found is None:
        found = draw()
        forget()
    return found


def forget() -> None:
    """End of the rerun: the next one draws the sidebar again, so no page reads a stale snapshot."""
    st.session_state.pop(_STATE, None)
