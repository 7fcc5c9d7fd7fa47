"""The doctor as background jobs: a diagnosis (profile the baseline, calibrate this machine's rates, predict each
technique) and its verification (an interleaved ablation of the top picks), each run by a worker process under
a lock in the store's ``jobs`` table, the way the dashboard runs an ablation (:mod:`lab.jobs`).

Why jobs and not a call in the page: the Doctor page ran :func:`~lab.doctor.diagnosis.diagnose` and
:func:`~lab.doctor.verification.verify` inside the Streamlit script under a spinner, so a reload lost the work in
progress, nothing said how far it got, and a second tab profiled again against the first. As jobs, a reload
re-attaches to the one that runs (its progress is the job's state: "profiling the baseline: step 12/40",
"predicting bf16 (3/9)", "verifying: run 4/9 ..."), a double click joins it (one lock per workload, size and
thread count), and what they found is stored: the diagnosis in the store's ``diagnoses`` table
(:mod:`lab.doctor.stored`, which the recommendation card reads), its row id in the job's state; the
verification's rows in its job's state (and the doctor's history file, as ``lab doctor --verify`` appends).

This module is its own worker entry (``python -m lab.doctor.jobs``, started by :func:`lab.jobs.launch.start`
with ``module=WORKER``): the ablation lane's worker sits below the doctor in the layers and cannot import it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lab import jobs
from lab.ablation import AA_ARM
from lab.config import RunConfig
from lab.doctor.diagnosis import Diagnosis, diagnose
from lab.doctor.stored import StoredDiagnosis, diagnosis_by_id, last_diagnosis, save_diagnosis
from lab.doctor.verification import top_predictions, verify_predictions
from lab.store import ResultStore

#: The job kinds (a spec's ``"kind"``): a page re-attaches only to jobs of its own kind.
DIAGNOSE = "doctor"
VERIFY = "doctor_verify"
#: The ``python -m`` module that runs them (:func:`lab.jobs.launch.start`'s ``module``).
WORKER = "lab.doctor.jobs"
#: The share of a diagnosis's progress bar each stage starts at (the profiled run is most of its time).
_STAGE_AT = {"profile": 0.0, "calibrate": 0.6, "predict": 0.9, "store": 0.98}


def _where(cfg: RunConfig) -> str:
    return f"{cfg.workload_spec or cfg.workload}/{cfg.size}/t{cfg.threads or 0}"


def diagnose_spec(cfg: RunConfig, techniques: Sequence[str] | None = None) -> tuple[str, dict[str, Any]]:
    """(key, spec) of a diagnosis job. One key per workload, size and thread count (``diagnose@ctr/tiny/t1``),
    whatever the techniques: a second click (or tab) joins the profile in progress instead of timing against it."""
    return (f"diagnose@{_where(cfg)}",
            {"kind": DIAGNOSE, "config": cfg.to_dict(), "techniques": None if techniques is None else list(techniques)})


def verify_spec(d: StoredDiagnosis, k: int, repeats: int = 3) -> tuple[str, dict[str, Any]]:
    """(key, spec) of the verification of the stored diagnosis ``d`` (its row id): its top ``k`` predictions,
    ``repeats`` interleaved repeats each. One key per workload, size and threads, as :func:`diagnose_spec`."""
    if d.id is None or d.config is None:
        raise ValueError("this diagnosis was not stored with its config: profile again to verify it")
    top_predictions(d.predictions, k)  # a bad k or nothing to verify: said here, before a worker starts
    return (f"verify@{_where(RunConfig.from_dict(d.config))}",
            {"kind": VERIFY, "diagnosis": int(d.id), "k": int(k), "repeats": int(repeats)})


def _spec(store: ResultStore, key: str, spec: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    if spec is None:
        row = jobs.job(store, key)
        spec = row["spec"] if row is not None else None
    if not spec or spec.get("kind") != kind:
        raise ValueError(f"job {key} is not a {kind} job (its spec: {spec!r})")
    return spec


class _Track:
    """The job's state as the pages read it (:func:`progress`): the stage, what it is doing, the profiled run's
    step; written to the store at once when a stage starts and at the run's first and last step (the heartbeat
    thread writes the steps between)."""

    def __init__(self, hb: jobs.Heartbeat) -> None:
        self.hb = hb
        hb.state = {"started_at": time.time(), "published_at": time.time()}

    def stage(self, name: str, message: str) -> None:
        self.hb.state = {**self.hb.state, "stage": name, "arm": message, "published_at": time.time()}
        self.hb.write()  # reads the Cancel flag too: a Cancel pressed during the last stage stops this one
        self.hb.check()

    def step(self, event: dict[str, Any]) -> None:
        if "step" in event:
            self.hb.state = {**self.hb.state, "step": event["step"], "total_steps": event.get("total_steps"),
                             "published_at": time.time()}
            if event["step"] in (1, event.get("total_steps")):
                self.hb.write()
        self.hb.check()


def run_diagnosis(store: ResultStore, key: str, token: str | None = None, spec: dict[str, Any] | None = None,
                  diagnose_fn: Callable[..., Diagnosis] | None = None) -> int:
    """Diagnose the job's config under its lock (claimed here, or adopted with the launcher's ``token``), say
    each stage as it starts, store the diagnosis (:func:`~lab.doctor.stored.save_diagnosis`) and return its row id,
    also kept in the job's final state (``diagnosis``, with the prescribed pick as ``top``). A second run of a live
    key is :class:`~lab.jobs.AlreadyRunning` before any work. ``diagnose_fn``: tests pass a fake."""
    spec = _spec(store, key, spec, DIAGNOSE)
    cfg = RunConfig.from_dict(spec["config"])
    diagnose_fn = diagnose if diagnose_fn is None else diagnose_fn
    with jobs.holding(store, key, token, spec=spec) as hb:
        track = _Track(hb)
        d = diagnose_fn(cfg, techniques=spec.get("techniques"), progress=track.step, stage=track.stage)
        track.stage("store", "storing the diagnosis")
        did = save_diagnosis(store, d)
        top = d.top()
        hb.state = {**hb.state, "diagnosis": did, "top": top.technique if top else None,
                    "predictions": len(d.predictions)}
    return did


class _Verifying:
    """The verification's ablation events as the job's state: run i/n, the arm, its repeat and step, time left
    (the mean of the runs finished so far times the runs left)."""

    def __init__(self, hb: jobs.Heartbeat, total: int, repeats: int) -> None:
        self.hb, self.ended, self.repeats = hb, [], repeats
        self.run_t0 = time.monotonic()
        hb.state = {"started_at": time.time(), "published_at": time.time(), "stage": "verify", "done": 0,
                    "total": total, "repeats": repeats, "arm": "baseline", "repeat": 0, "step": 0,
                    "total_steps": None, "eta_s": None}

    def __call__(self, event: dict[str, Any]) -> None:
        s = dict(self.hb.state)
        if event.get("phase") == "run":
            inner = event.get("event") or {}
            s.update(arm=event.get("arm"), step=inner.get("step", s.get("step")),
                     total_steps=inner.get("total_steps", s.get("total_steps")),
                     repeat=s["done"] // max(1, s["total"] // self.repeats))  # rounds of every arm, in order
        elif event.get("phase") == "ablation":
            now = time.monotonic()
            if not event.get("skipped"):
                self.ended.append(now - self.run_t0)
            self.run_t0 = now
            s.update(done=event["done"], total=event["total"], arm=None, ended=event["arm"],
                     repeat=event.get("repeat"), step=0, total_steps=None)  # the next arm says itself at its 1st step
            left = event["total"] - event["done"]
            s["eta_s"] = sum(self.ended) / len(self.ended) * left if self.ended else None
        s["published_at"] = time.time()
        self.hb.state = s
        self.hb.check()


def run_verify(store: ResultStore, key: str, token: str | None = None,
               spec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Verify the stored diagnosis the job names (its top ``k``, ``repeats`` each) under the job's lock: an
    interleaved ablation (:func:`~lab.doctor.verification.verify_predictions`, itself under the ablation's own
    lock) whose runs are the job's progress; the predicted-vs-measured rows are returned and kept in the job's
    final state (``rows``)."""
    spec = _spec(store, key, spec, VERIFY)
    d = diagnosis_by_id(store, spec["diagnosis"])
    if d is None or d.config is None:
        raise ValueError(f"diagnosis {spec['diagnosis']} is not in {store.path} with its config: profile again")
    chosen = top_predictions(d.predictions, int(spec["k"]))
    repeats = int(spec.get("repeats") or 3)
    with jobs.holding(store, key, token, spec=spec) as hb:
        track = _Verifying(hb, (len(chosen) + 2) * repeats, repeats)  # the baseline, the picks and the A/A arm
        hb.write()
        rows = verify_predictions(RunConfig.from_dict(d.config), chosen, repeats=repeats, store=store,
                                  progress=track, base_step_ms=(d.train or {}).get("step_ms"),
                                  hardware_id=d.hardware_id, rate_source=d.rate_source,
                                  run_steps=(d.run or {}).get("steps"))
        hb.state = {**hb.state, "rows": rows, "done": hb.state["total"]}
    return rows


def _arm(name: str) -> str:
    return "A/A (the baseline again: the noise floor)" if name == AA_ARM else name


def _clock(seconds: float | None) -> str:
    s = int(round(seconds or 0.0))
    return f"{s // 60}:{s % 60:02d}"


def progress(job: dict[str, Any], now: float | None = None) -> tuple[float, str]:
    """(fraction done, one line) of a doctor job from its state: "profiling the baseline: step 12/40",
    "calibrating this machine's rates: bf16 GEMMs ...", "predicting bf16 (3/9)", "verifying: run 4/9, arm bf16
    (repeat 1), step 5/20; about 0:12 left", each with the time elapsed."""
    s = job.get("state") or {}
    now = time.time() if now is None else now
    elapsed = f"elapsed {_clock(now - s.get('started_at', now))}"
    stage, what = s.get("stage"), s.get("arm")
    if not what and not (stage == "verify" and s.get("ended")):
        return 0.0, "starting the worker (importing torch, building data)"
    step, steps = s.get("step") or 0, s.get("total_steps")
    if stage == "verify":
        done, total = int(s.get("done") or 0), int(s.get("total") or 0)
        frac = (done + (step / steps if steps else 0.0)) / total if total else 0.0
        since = now - s.get("published_at", now)
        left = ("about " + _clock(max(0.0, s["eta_s"] - since)) + " left" if s.get("eta_s") is not None
                else "time left: after the first run")
        run = f"verifying: run {min(done + 1, total)}/{total}"
        if not what:  # between two runs: the next one names its arm at its first step
            arm = _arm(s["ended"])
            return min(frac, 1.0), (f"{run}: building it (run {done}, {arm}, ended); {elapsed}, {left}"
                                    if done < total else f"{run}: {arm} ended; {elapsed}")
        where = f", step {step}/{steps}" if steps else ""
        return min(frac, 1.0), (f"{run}, arm **{_arm(what)}** (repeat {int(s.get('repeat') or 0) + 1}/"
                                f"{s.get('repeats', '?')}){where}; {elapsed}, {left}")
    if stage == "profile":
        if steps and step >= steps:
            return 0.55, (f"profiling the baseline: trained {steps} steps, now profiling its step and inference; "
                          f"{elapsed}")
        frac = 0.5 * step / steps if steps else 0.0
        where = f": step {step}/{steps}" if steps else " (building its model and data)"
        return frac, f"profiling the baseline{where}; {elapsed}"
    if stage == "calibrate":
        return _STAGE_AT["calibrate"], f"calibrating this machine's rates: {what}; {elapsed}"
    if stage == "predict":
        name, _, count = what.partition(" (")  # "bf16 (3/9)": the technique, then the share of the predictions made
        i, _, n = count.rstrip(")").partition("/")
        frac = _STAGE_AT["predict"] + (0.08 * int(i) / max(1, int(n)) if i.isdigit() and n.isdigit() else 0.0)
        return frac, f"predicting **{name}**" + (f" ({count}" if count else "") + f"; {elapsed}"
    return _STAGE_AT.get(str(stage), 0.0), f"{what}; {elapsed}"


@dataclass(frozen=True)
class NextStep:
    """What the recommendation card offers when nothing is measured yet for its workload and size: the doctor's
    diagnosis (no stored diagnosis either) or the verification of its top picks (a diagnosis, no ablation), as the
    job the Doctor tab starts (same key and spec: a click on either joins the other's), or the one of them already
    running (``running``: its job row, whose progress the card shows instead of the button)."""

    kind: str  # DIAGNOSE | VERIFY
    key: str
    spec: dict[str, Any]
    label: str  # the button
    why: str  # one line under it
    running: dict[str, Any] | None = None


def _running(store: ResultStore, workload: str, size: str) -> dict[str, Any] | None:
    """The live doctor job (a diagnosis or a verification, any thread count) of ``workload`` at ``size``."""
    where = f"@{workload}/{size}/t"
    return next((j for j in jobs.live_jobs(store) if j["kind"] in (DIAGNOSE, VERIFY) and where in j["key"]), None)


def next_step(store: ResultStore, workload: str, size: str, *, measured: bool, here: str, threads: int | None = None,
              k: int = 3, repeats: int = 3) -> NextStep | None:
    """The card's next step for ``workload`` at ``size`` on the machine ``here`` (None when it has one already:
    ``measured``, a stored ablation it reads). No stored diagnosis: diagnose (at ``threads``, every technique, as the
    Doctor tab's **Profile and predict** by default). A diagnosis: verify its top ``k`` picks with ``repeats``
    interleaved repeats each (3: enough runs per arm for a verdict, so the card reads the verification once it
    ends). A doctor job of this workload and size already running: that one, to show."""
    if measured:
        return None
    live = _running(store, workload, size)
    d = last_diagnosis(store, workload, size, here)
    if d is None or (live is not None and live["kind"] == DIAGNOSE):
        key, spec = diagnose_spec(RunConfig(workload=workload, size=size, threads=threads))
        return NextStep(DIAGNOSE, key, spec, f"Diagnose {workload} at size {size}",
                        "Nothing is measured or predicted here yet: the doctor profiles one baseline and predicts "
                        "which technique pays on this machine (the Doctor tab's Profile and predict, in the "
                        "background); or press Run ablation in the sidebar to measure the recipe.", live)
    try:
        key, spec = verify_spec(d, min(k, len(d.predictions)), repeats)
    except ValueError:  # nothing to verify, or a diagnosis stored without its config: the card says what it has
        return None
    picks = ", ".join(p.technique for p in top_predictions(d.predictions, spec["k"]))
    return NextStep(VERIFY, key, spec, f"Verify the doctor's top picks: {picks}",
                    f"The doctor predicted (diagnosed {d.age_text()}); nothing is measured yet. Verifying runs the "
                    f"baseline, {picks} and the A/A arm side by side, {repeats} repeats each (an interleaved ablation, "
                    "in the background): enough for a verdict, which this card then reads.", live)


def run_job(store: ResultStore, key: str, token: str | None = None) -> Any:
    """Run the claimed doctor job ``key`` by its kind (what the worker process does)."""
    row = jobs.job(store, key)
    kind = row["kind"] if row is not None else None
    if kind == DIAGNOSE:
        return run_diagnosis(store, key, token, row["spec"])
    if kind == VERIFY:
        return run_verify(store, key, token, row["spec"])
    raise ValueError(f"job {key} is not a doctor job (kind {kind!r})")


def main(argv: list[str] | None = None) -> int:
    from lab.jobs import launch

    return launch.serve(argv, prog="python -m lab.doctor.jobs", description=__doc__.splitlines()[0],
                        run=lambda store, key, token, _row: run_job(store, key, token))


__all__ = ["DIAGNOSE", "VERIFY", "WORKER", "NextStep", "diagnose_spec", "main", "next_step", "progress",
           "run_diagnosis", "run_job", "run_verify", "verify_spec"]

if __name__ == "__main__":
    sys.exit(main())
