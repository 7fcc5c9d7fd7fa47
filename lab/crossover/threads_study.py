"""The threads study end to end: the map at 1 thread and at all cores, compared, then loader
workers against compute threads along the vision ladder, in the benchmark envelope.

Why a module of its own: :mod:`lab.crossover.threads` holds the analysis (pure comparison, the ladder
measurement with an injected ``run``); this one decides what a quick and a full study measure, turns the
result into the figures ``python -m lab bench`` reports, and reads and writes the JSON
(``benchmarks/results/<hardware-id>/crossover_threads.json``) that the dashboard's "Threads" section shows.
Used by ``python -m lab threads`` and ``benchmarks/crossover_threads.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.config import RunConfig
from lab.crossover.mapping import build_map
from lab.crossover.report import write_strict_json
from lab.crossover.threads import (
    FULL_LADDER,
    FULL_MAP_RUNGS,
    FULL_TECHNIQUES,
    FULL_WORKLOADS,
    NO_VERDICT,
    QUICK_LADDER,
    QUICK_MAP_RUNGS,
    QUICK_TECHNIQUES,
    QUICK_WORKLOADS,
    compare_maps,
    fmt_x,
    usable_cores,
    workers_along_ladder,
)
from lab.measure import environment_stamp
from lab.workloads import get_workload


def _paired_maps(workloads: Sequence[str], techniques: Sequence[str], *, quick: bool, cores: int,
                 progress: Callable[[str], None] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The map at 1 thread and at ``cores``, alternating per workload (1, N, 1, N ...), so the machine's drift
    between the two spans one workload's ladder rather than the whole map. Both at the crossover's quick
    settings (a quarter batch, 3 rounds) on :data:`QUICK_MAP_RUNGS` / :data:`FULL_MAP_RUNGS` (ctr: xs, m, xl,
    whose embeddings make the lower rungs close): two full maps would take hours here."""
    maps: dict[int, dict[str, Any]] = {}
    for name in workloads:
        want = QUICK_MAP_RUNGS if quick else ("xs", "m", "xl") if name == "ctr" else FULL_MAP_RUNGS
        rungs = [r for r in want if r in get_workload(name).scales]
        for threads in (1, cores):
            if progress:
                progress(f"map at {threads} thread(s): {name}")
            part = build_map([name], techniques, quick=True, threads=threads, repeats=3, rungs={name: rungs},
                             skip_emulated=quick,
                             progress=progress)
            got = maps.setdefault(threads, {"rows": [], "crossovers": [], "fits": [], "rungs": [], "wall_s": 0.0,
                                            "threads": threads, "env": part["env"]})
            for k in ("rows", "crossovers", "fits", "rungs"):
                got[k] += part[k]
            got["wall_s"] += part["wall_s"]
    return maps[1], maps[cores]


def threads_study(workloads: Sequence[str] | None = None, techniques: Sequence[str] | None = None, *,
                  quick: bool = False, run: Callable[[RunConfig], Any] | None = None, cores: int | None = None,
                  ladder_workload: str = "vision", ladder_rungs: Sequence[str] | None = None,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both halves, in the benchmark envelope: the map at 1 thread and at all cores and their comparison,
    then workers vs compute threads along ``ladder_workload``'s ladder. ``run`` defaults to
    :func:`lab.train.run`."""
    if run is None:
        from lab.train import run
    cores = cores or usable_cores()
    if cores < 2:
        raise ValueError(f"this machine has {cores} usable core: the threads study compares 1 thread with more")
    workloads = list(workloads or (QUICK_WORKLOADS if quick else FULL_WORKLOADS))
    techniques = list(techniques or (QUICK_TECHNIQUES if quick else FULL_TECHNIQUES))
    t0 = time.monotonic()
    map_1, map_n = _paired_maps(workloads, techniques, quick=quick, cores=cores, progress=progress)
    comparison = compare_maps(map_1, map_n)
    rungs, rounds, steps = QUICK_LADDER if quick else FULL_LADDER
    ladder = workers_along_ladder(ladder_workload, ladder_rungs or rungs, run=run, cores=cores, repeats=rounds,
                                  max_steps=steps, progress=progress)
    study = {"benchmark": "crossover_threads", "quick": quick, "env": environment_stamp("cpu"), "cores": cores,
             "measured_at": datetime.now(UTC).isoformat(timespec="seconds"), "comparison": comparison,
             "ladder": ladder, "maps": {"1": map_1, str(cores): map_n},
             "note": "measured on a shared machine: other load swings multi-threaded timings; read the CIs",
             "wall_s": round(time.monotonic() - t0, 1)}
    study["figures"] = study_figures(study)
    return study


def _fig(name: str, value: float | None, *, unit: str = "x", ci: list[float] | None = None, goal: str | None = None,
         met: bool | None = None, note: str = "") -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "ci95": ci, "goal": goal, "met": met, "note": note,
            "family": "crossover"}


#: The project's own goal for the rule, mirroring the crossover's agreement goal: where the measurement
#: separates the two pairs, the lab's rule should have picked the winner.
RULE_AGREEMENT_GOAL = 0.75


def study_figures(study: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures ``lab bench`` reports: base thread scaling per rung, the flips, the worker ratio per rung
    (CI), where a worker stops paying, and how often the rule picked the measured winner."""
    comp, ladder = study["comparison"], study["ladder"]
    n = comp["threads"][1]
    out = [_fig(f"{s['workload']} {s['rung']} ({(s['params'] or 0) / 1e6:.2g} M params) fp32 "
                f"{s['axis'].replace('_', ' ')}: 1 thread / {n} threads", s["scaling"], note=s["why"][:100])
           for s in comp["scaling"]]
    judged = [r for r in comp["rows"] if NO_VERDICT not in (r["verdict_1"], r["verdict_n"])]
    out.append(_fig(f"technique verdicts that flip between 1 and {n} threads", len(comp["flips"]), unit="count",
                    note=f"of {len(judged)} judged; " + "; ".join(f"{r['workload']} {r['rung']} {r['technique']}"
                                                                   for r in comp["flips"])[:80]))
    for r in ladder["rows"]:
        out.append(_fig(f"{r['workload']} files {r['rung']} ({(r['params'] or 0) / 1e6:.2g} M params): "
                        f"{n - 1} thread(s) + 1 worker / {n} threads + prefetcher", r["ratio"], ci=r["ci95"],
                        note=f"{r['verdict']}; loader {r['loader_ms_per_batch']:.3g} ms/batch, compute "
                             f"{r['compute_ms_per_step']:.3g} ms/step"))
    stop = ladder["answer"]["stops_paying_from"]
    out.append(_fig(f"{ladder['workload']}: a loader worker stops paying from (params)",
                    stop["params"] if stop else None, unit="params", note=ladder["answer"]["text"][:100]))
    agree = [r["rule_agrees"] for r in ladder["rows"] if r["rule_agrees"] is not None]
    share = sum(agree) / len(agree) if agree else None
    out.append(_fig("the rule picks the measured winner (rungs where the CI separates the pairs)", share,
                    unit="share", goal=f">= {RULE_AGREEMENT_GOAL:.0%}",
                    met=share >= RULE_AGREEMENT_GOAL if share is not None else None,
                    note=f"{sum(agree)} of {len(agree)} rungs"))
    return out


def write_study(study: dict[str, Any], path: str | Path) -> Path:
    """Write the study as strict JSON (NaN / inf become null), creating the folder."""
    return write_strict_json(study, path)


def summary_lines(study: dict[str, Any]) -> list[str]:
    """What the CLI and the benchmark print: the comparison's headline, then the ladder row by row."""
    lad = study["ladder"]
    lines = list(study["comparison"]["headline"])
    lines.append(f"{lad['workload']} (files, {lad['storage']}): {lad['cores'] - 1} thread(s) + 1 worker vs "
                 f"{lad['cores']} threads + prefetcher")
    for r in lad["rows"]:
        ci = f" [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]" if r["ci95"] else ""
        lines.append(f"  {r['rung']:<3} {r['params'] or 0:>11,} params  {fmt_x(r['ratio'])}{ci}  {r['verdict']:<16} "
                     f"rule: {r['rule']['threads']} thread(s) + {r['rule']['workers']} worker(s)")
    lines.append(lad["answer"]["text"])
    lines.append(f"wall time {study['wall_s']:.0f} s on {study['cores']} cores")
    return lines


def load_study(path: str | Path) -> dict[str, Any]:
    """A study written by :func:`write_study`; ``ValueError`` naming what is missing."""
    study = json.loads(Path(path).read_text())
    for key in ("comparison", "ladder", "figures"):
        if key not in study:
            raise ValueError(f"{path}: not a threads study (lacks {key!r})")
    return study
