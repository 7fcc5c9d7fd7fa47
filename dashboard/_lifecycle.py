"""A long job's lifecycle on a page: claim its lock in the store, start the background worker
(:mod:`lab.ablation.worker`, or :mod:`lab.doctor.jobs` for the doctor's), re-attach after a reload, show
progress, cancel. The Ablation tab runs ablations through it, the Data-loading tab its measurements (a batch of
runs, one per loader), the Machine tab its card and the Doctor tab its diagnosis and verification: none trains
in the Streamlit script.

Why the store and not ``st.session_state``: a reload is a new session and a double click is two reruns;
only the store (:mod:`lab.jobs`) is shared by all of them and by the worker process, so it is the
one place that knows whether a job is running and how far it got.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import _shared
import streamlit as st

from lab import ResultStore, jobs
from lab.ablation import load_ablation, summarize
from lab.ablation.runner import from_spec
from lab.ablation.worker import BATCH, MACHINE, WORKER
from lab.doctor import jobs as doctor_jobs
from lab.jobs.launch import log_path
from lab.jobs.launch import start as start_worker

#: Seconds between progress refreshes while a job runs (a line of text: cheap to redraw).
REFRESH_S = 5.0
#: Seconds between redraws of a running job's figures so far (a chart and a table: a redraw costs the server and
#: the browser about a core for most of a second, which the worker's contention meter rightly counts as another
#: process; redrawn every second, the page alone made every run of a 2-core machine's ablation "busy").
FIGURES_S = 10.0


#: The key prefix of the doctor's verification ablation (run inside a verification job, :mod:`lab.doctor.jobs`):
#: stored as an ablation, shown on the Doctor tab, never re-attached by the Ablation tab (running or last).
VERIFY_PREFIX = "doctor@"


@dataclass(frozen=True)
class Lane:
    """One page's kind of job: the jobs it re-attaches to, the session keys that remember which one it
    shows (``<prefix>key``, ``<prefix>note``) and what its messages call it and its button."""

    kind: str
    prefix: str
    noun: str
    button: str  # what starts one
    worker: str = WORKER  # the ``python -m`` module that runs the lane's jobs

    @property
    def key(self) -> str:
        return self.prefix + "key"

    @property
    def note(self) -> str:
        return self.prefix + "note"


ABLATION = Lane(jobs.ABLATION, "job_", "ablation", "Run")
DATA = Lane(BATCH, "dl_job_", "data-loading measurement", "Measure loaders")
MACHINE_CARD = Lane(MACHINE, "mc_job_", "machine measurement", "Measure")
DOCTOR = Lane(doctor_jobs.DIAGNOSE, "doc_job_", "diagnosis", "Profile and predict", doctor_jobs.WORKER)
VERIFY = Lane(doctor_jobs.VERIFY, "ver_job_", "verification", "Verify", doctor_jobs.WORKER)
#: Job kinds whose progress :mod:`lab.doctor.jobs` words (stages, not an ablation's runs).
_DOCTOR_KINDS = (doctor_jobs.DIAGNOSE, doctor_jobs.VERIFY)


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 60}:{s % 60:02d}"


def attached_job(store: ResultStore, lane: Lane = ABLATION) -> dict[str, Any] | None:
    """The job this session shows: the one it started or joined, else (a reload, a new tab) the live one
    of the lane's kind, else the last one."""
    key = st.session_state.get(lane.key)
    if key is not None:
        found = jobs.job(store, key)
        if found is not None and found["kind"] == lane.kind:
            return found
    live = [j for j in jobs.live_jobs(store, lane.kind) if not j["key"].startswith(VERIFY_PREFIX)]
    if live:
        st.session_state[lane.key] = live[0]["key"]
        st.session_state[lane.note] = (f"Re-attached to the {lane.noun} that is running (started before this "
                                       "page loaded).")
        return live[0]
    last = next((j for j in jobs.recent_jobs(store, lane.kind) if not j["key"].startswith(VERIFY_PREFIX)), None)
    if last is not None and last["spec"] is not None:  # a reload after the end shows the last results again
        st.session_state[lane.key] = last["key"]
        st.session_state[lane.note] = (f"Showing the last {lane.noun} run from this dashboard (`{last['key']}`, "
                                       f"{last['status']}); press {lane.button} for a new one.")
        return last
    return None


def start_or_join(store: ResultStore, key: str, spec: dict[str, Any], lane: Lane = ABLATION) -> None:
    """Claim the key and start a worker; a key that is already running is joined, not started twice."""
    st.session_state[lane.key] = key
    try:
        token = jobs.claim(store, key, spec=spec)
    except jobs.AlreadyRunning as exc:
        st.session_state[lane.note] = f"Joined the run in progress: {exc}."
        return
    try:
        start_worker(store.path, key, token, module=lane.worker)
    except OSError as exc:
        jobs.finish(store, key, token, "error", {"error": f"the worker could not start: {exc}"})
    st.session_state[lane.note] = None


def progress_line(job: dict[str, Any]) -> tuple[float, str]:
    """(fraction done, one line: run i/n, arm, step, elapsed, time left; a heartbeat while no step comes)."""
    s = job["state"]
    now = time.time()
    since = now - s.get("published_at", now)  # the state is as of its last step; the clock runs on
    total, done = s.get("total") or 0, s.get("done") or 0
    if job.get("kind") in _DOCTOR_KINDS:  # profile, calibrate, predict; a verification's runs
        frac, text = doctor_jobs.progress(job, now)
        return frac, f"{text}; heartbeat {job['age_s']:.0f} s ago"
    if not s.get("arm"):
        return 0.0, f"starting the worker (importing torch, building data); heartbeat {job['age_s']:.0f} s ago"
    if job.get("kind") == MACHINE:  # stages, not runs: the fraction is the time spent of the estimate
        spent, estimate = now - s.get("started_at", now), float(s.get("estimate_s") or 15)
        return min(spent / estimate, 0.99), (f"stage {s.get('stage')}: **{s['arm']}**; elapsed {_clock(spent)} of "
                                             f"about {_clock(estimate)}; heartbeat {job['age_s']:.0f} s ago")
    step, steps = s.get("step") or 0, s.get("total_steps")
    frac = (done + (step / steps if steps else 0.0)) / total if total else 0.0
    where = f"step {step}/{steps}" if steps else (
        f"working for {_clock(now - s.get('run_started_at', now))} before its first step (building, compiling or "
        "measuring)")
    left = None if s.get("eta_s") is None else max(0.0, s["eta_s"] - since)
    left_text = f"about {_clock(left)} left" if left is not None else "time left: after the first step"
    what = (f"**{s['arm']}**" if job.get("kind") == BATCH
            else f"arm **{s['arm']}** (repeat {s.get('repeat')}, seed {s.get('seed')})")
    elapsed = _clock(now - s.get("started_at", now))
    return min(frac, 1.0), (f"run {min(done + 1, total)}/{total}: {what}, {where}; elapsed {elapsed}, {left_text}; "
                            f"heartbeat {job['age_s']:.0f} s ago")


def worker_line(job: dict[str, Any], noun: str) -> str:
    """The caption above a running job: which process runs it and where its log is. The pid is the worker's
    only once it has adopted the job (status ``running``); until then the row holds the pid of the server
    that claimed it, which is not the process doing the work, so none is named."""
    if job["status"] == "running" and job["pid"] != os.getpid():
        who = f"pid {job['pid']}"
    else:
        who = "starting: its pid shows once it has taken the job over"
    log = log_path(_shared.store().path, job["token"])
    kept = {MACHINE: "the card is cached when it ends", doctor_jobs.DIAGNOSE: "the diagnosis is stored when it ends",
            doctor_jobs.VERIFY: "its runs are stored as they end"}.get(job.get("kind"),
                                                                       "finished runs are stored as they end")
    return (f"The {noun} `{job['key']}` runs in a background worker ({who}; its log: `{log}`): reloading this page "
            f"re-attaches to it; {kept}.")


def live_progress(key: str, so_far: Callable[[dict[str, Any]], None] | None = None, noun: str = "ablation",
                  lead: str = "") -> None:
    """While the job runs: its progress, redrawn every :data:`REFRESH_S` seconds, and under it ``so_far(job)``
    (the figures of the runs finished so far), redrawn only every :data:`FIGURES_S` seconds, so that the page
    does not itself make the machine it measures busy; a full rerun when the job ends shows the results."""
    _progress(key, noun, lead)
    if so_far is not None:
        _figures_so_far(key, so_far)


@st.fragment(run_every=REFRESH_S)
def _progress(key: str, noun: str, lead: str) -> None:
    """``lead`` and :func:`worker_line` (in here, so the worker's pid shows as soon as it adopts the job, not at
    the next full rerun) and the progress line; the full rerun when the job has ended."""
    found = jobs.job(_shared.store(), key)
    if found is None or not found["live"]:
        st.rerun()
    st.caption(lead + worker_line(found, noun))
    frac, line = progress_line(found)
    st.progress(frac, text="running" + (" (cancel requested: stops before the next step)" if found["cancel"] else ""))
    st.markdown(line)


@st.fragment(run_every=FIGURES_S)
def _figures_so_far(key: str, so_far: Callable[[dict[str, Any]], None]) -> None:
    found = jobs.job(_shared.store(), key)
    if found is not None and found["live"]:  # once it has ended, the progress fragment's full rerun redraws all
        so_far(found)


def ended_badly(job: dict[str, Any], noun: str) -> None:
    """Say how a job that is not running ended, when not as ``done``: cancelled, or an error (with the end
    of its worker's log when it died without a word)."""
    if job["status"] == "cancelled" and job.get("kind") == MACHINE:
        st.warning("The machine measurement was cancelled: the card below (if any) is the one cached before it.")
    elif job["status"] == "cancelled" and job.get("kind") in _DOCTOR_KINDS:
        st.warning(f"The {noun} was cancelled: showing the last one that ended.")
    elif job["status"] == "cancelled":
        st.warning(f"Cancelled after {job['state'].get('done', 0)} of {job['state'].get('total', '?')} runs: "
                   "showing the finished ones" + (" (Run resumes from them)." if noun == "ablation" else "."))
    elif job["status"] == "error" or (job["status"] in jobs.LIVE and not job["live"]):
        st.error(f"The {noun} stopped: {job['state'].get('error') or 'its worker died without a word'}")
        tail = worker_log_tail(job)
        if tail:
            st.code(tail, language=None)


def worker_log_tail(job: dict[str, Any], lines: int = 15) -> str:
    """The end of the job's worker log (empty when there is none): why a worker died without a word."""
    try:
        text = log_path(_shared.store().path, job["token"]).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def results(store: ResultStore, job: dict[str, Any]) -> tuple[Any, dict] | None:
    """The finished ablation's table and runs, rebuilt from its spec and the stored runs (None: no baseline)."""
    ablation, repeats, seeds = from_spec(job["spec"])
    runs = load_ablation(ablation, store, repeats, seeds)
    if not runs.get("baseline"):
        return None
    return summarize(runs, techniques=ablation.techniques, axes=ablation.axes), runs
