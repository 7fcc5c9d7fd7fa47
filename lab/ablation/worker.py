"""The background worker of the dashboard's ablation lane: ``python -m lab.ablation.worker --store DB --key KEY
--token TOKEN`` rebuilds the job from its row (:mod:`lab.jobs`), adopts the lock its launcher
claimed and runs it; progress, heartbeat, cancel and the final status go through the store. A job is an
ablation (its spec from :func:`~lab.ablation.runner.to_spec`), a batch (:func:`batch_spec`: named runs,
each stored as it ends under ``batch:<key>:<name>``, their run ids in the job's state; the dashboard's
data-loading measurement, one run per loader) or a machine card (:func:`machine_spec`: the Machine page's
measurement, cached where every process reads it).

Why a separate process rather than a thread of the Streamlit server: a click or a reload reruns the app's
script, never this process, so a run is neither lost nor started twice; Cancel is a flag read between steps;
and a DDP arm's spawned ranks re-import *this* module as their ``__main__`` (multiprocessing's spawn
re-imports the parent's main module) instead of the dashboard's ``app.py``, which Streamlit runs as
``__main__``: the ranks never execute the app.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from lab import jobs
from lab.ablation.runner import RunFn, _error_result, _Progress, from_spec, run_ablation
from lab.config import RunConfig
from lab.jobs import launch
from lab.result import RunResult
from lab.store import ResultStore, config_hash
from lab.train import run

#: The ``python -m`` module that runs this lane's jobs (:func:`lab.jobs.launch.start`'s ``module``).
WORKER = "lab.ablation.worker"
#: The job kind of a batch of named runs (``spec["kind"]``).
BATCH = "batch"
#: The job kind of a machine-card measurement (:func:`machine_spec`; the dashboard's Machine page).
MACHINE = "machine_card"


def start(store_path: str | os.PathLike[str], key: str, token: str) -> subprocess.Popen:
    """Launch this worker for a claimed ablation, batch or machine-card job (:func:`lab.jobs.launch.start` with
    this module)."""
    return launch.start(store_path, key, token, module=WORKER)


def batch_spec(name: str, configs: dict[str, RunConfig]) -> tuple[str, dict[str, Any]]:
    """(key, spec) of a batch job: ``configs`` run once each, in order. The key is ``name``, the first
    config's workload and a hash of the named configs (``loaders@ctr#1a2b3c4d``), so the same batch asked
    twice is one job (joined while it runs) and a different one is another."""
    if not configs:
        raise ValueError("configs={} is invalid: allowed: one or more named RunConfigs")
    named = {n: c.to_dict() for n, c in configs.items()}
    digest = hashlib.sha1(json.dumps([(n, config_hash(c)) for n, c in named.items()]).encode()).hexdigest()[:8]
    key = f"{name}@{next(iter(configs.values())).workload}#{digest}"
    return key, {"kind": BATCH, "name": name, "configs": named}


def run_batch(store: ResultStore, key: str, token: str | None = None, spec: dict[str, Any] | None = None,
              run_fn: RunFn | None = None) -> dict[str, RunResult]:
    """Run a batch job's configs under its lock (claimed here, or adopted with the launcher's ``token``),
    each stored as it ends; the job's state carries ``runs`` (name -> run id) and the progress the pages
    show (run i/n, the run's name as ``arm``, step, time left). A failing run is an error row; Cancel stops
    before the next step (:class:`~lab.jobs.Cancelled`; the run in flight is not stored)."""
    if spec is None:
        row = jobs.job(store, key)
        spec = row["spec"] if row is not None else None
    if not spec or spec.get("kind") != BATCH:
        raise ValueError(f"job {key} is not a batch job (its spec: {spec!r})")
    configs = {n: RunConfig.from_dict(c) for n, c in spec["configs"].items()}
    run_fn = run if run_fn is None else run_fn
    results: dict[str, RunResult] = {}
    with jobs.holding(store, key, token, spec=spec) as hb:
        track = _Progress(len(configs), hb)
        track.state["runs"] = {}
        for i, (name, cfg) in enumerate(configs.items()):
            track.start_run(i, name, 0, cfg.seed)
            try:
                result = run_fn(cfg, progress=track.step, on_error="record")
            except Exception as exc:  # refused before any work: an error row, the other runs still go
                result = _error_result(cfg, exc)
            store.add(result, label=f"{BATCH}:{key}:{name}")
            results[name] = result
            track.state["runs"][name] = result.run_id
            track.end_run(i, trained=True)
    return results


def batch_results(store: ResultStore, job: dict[str, Any]) -> dict[str, RunResult]:
    """The stored runs of a batch job, by name, in the batch's order (those finished so far)."""
    ids = (job.get("state") or {}).get("runs") or {}
    out = {}
    for name in (job.get("spec") or {}).get("configs", ids):
        if name in ids:
            with contextlib.suppress(KeyError):  # deleted since: the others still show
                out[name] = store.get(ids[name])
    return out


def machine_spec(quick: bool) -> tuple[str, dict[str, Any]]:
    """(key, spec) of a machine-card job: one per hardware id and mode (``machine@<hardware id>[/quick]``), so a
    second click or tab joins the measurement in progress instead of timing GEMMs against it."""
    from lab.measure import environment_stamp  # noqa: PLC0415 - the stamp reads /proc; only when asked

    return (f"machine@{environment_stamp()['hardware_id']}{'/quick' if quick else ''}",
            {"kind": MACHINE, "quick": bool(quick)})


def run_machine(store: ResultStore, key: str, token: str | None = None, spec: dict[str, Any] | None = None,
                measure: Callable[..., Any] | None = None) -> Any:
    """Measure and cache this machine's card (:func:`lab.measure.machine.machine_card`) under the job's lock:
    each stage the measurement names (a dtype's GEMM at a thread count, the triad, the small op) is the job's
    progress (``arm``: the stage, ``stage``: its number, ``estimate_s``), written as it starts; Cancel stops it
    at the next stage. ``measure`` defaults to ``machine_card``; tests pass a fake. Why a worker job: the
    Streamlit script blocked for 5-15 s (longer on a busy machine) with a spinner, and a second tab measured
    again at the same time, each timing GEMMs against the other."""
    from lab.measure import machine  # noqa: PLC0415

    if spec is None:
        row = jobs.job(store, key)
        spec = row["spec"] if row is not None else None
    if not spec or spec.get("kind") != MACHINE:
        raise ValueError(f"job {key} is not a machine-card job (its spec: {spec!r})")
    quick = bool(spec.get("quick"))
    measure = machine.machine_card if measure is None else measure
    with jobs.holding(store, key, token, spec=spec) as hb:
        hb.state = {"started_at": time.time(), "published_at": time.time(), "stage": 0,
                    "estimate_s": machine.ESTIMATE_S[quick]}

        def say(message: str) -> None:
            hb.check()  # Cancel: stop before the next stage
            hb.state = {**hb.state, "arm": message, "stage": hb.state["stage"] + 1, "published_at": time.time()}
            hb.write()

        card = measure(refresh=True, quick=quick, progress=say)
        hb.state = {**hb.state, "hardware_id": card.hardware_id, "done": 1}
    return card


def _run_job(store: ResultStore, key: str, token: str, row: dict[str, Any]) -> None:
    """Run the claimed job ``row`` by its kind: a batch of runs, the machine card, or an ablation."""
    if row["kind"] == BATCH:
        run_batch(store, key, token, row["spec"])
    elif row["kind"] == MACHINE:
        run_machine(store, key, token, row["spec"])
    else:
        ablation, repeats, seeds = from_spec(row["spec"])
        run_ablation(ablation, repeats=repeats, seeds=seeds, store=store, job_token=token)


def main(argv: list[str] | None = None) -> int:
    return launch.serve(argv, prog="python -m lab.ablation.worker", description=__doc__.splitlines()[0],
                        run=_run_job)


if __name__ == "__main__":
    sys.exit(main())
