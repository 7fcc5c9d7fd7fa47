"""Threads on the crossover map: the map at 1 thread against all cores, and loader workers
against compute threads along a model-size ladder.

Why: the crossover map is measured at 1 thread (docs/architecture.md rule 8: a fixed thread count for A/B), but a user
trains on all cores, and a second core changes the answer twice over. First, it buys the fp32 step more or
less depending on size: a dispatch-bound step (small models, per-operator overhead) has little arithmetic to
split, a compute-bound one splits well; a technique's speedup at N threads is its speedup at 1 thread times
(technique's own thread scaling / the baseline's), so a verdict can flip (:func:`compare_maps`, pure, on two
maps that :func:`lab.crossover.build_map` wrote). Second, loader workers share those cores (rule 4): on a
file-backed run (real PNG decode) a core given to a DataLoader worker decodes beside the step, a core given
to compute speeds the step. Small models are loader-bound and a worker pays; somewhere up the ladder the
step dominates and the core is worth more to compute (:func:`workers_along_ladder` measures where, and what
the lab's rule :func:`lab.data.studies.threads.recommend` would have picked). :mod:`.threads_study` runs both
for ``python -m lab threads`` and ``benchmarks/crossover_threads.py``; the dashboard page
"Where does it pay?" shows it (section "Threads", :mod:`lab.plots.scale_threads`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from lab.config import RunConfig
from lab.data.studies.threads import recommend, workers_vs_threads
from lab.measure import bootstrap_ratio_ci
from lab.workloads import SCALE_NAMES, get_workload

MIN_SAMPLES = 3  # docs/architecture.md rule 9: fewer samples, no interval, no verdict
#: What the study measures. Multi-threaded arms on a shared 2-core box run several times slower than their
#: 1-thread twins (the threads wait for cores other jobs hold), so the 2-thread half dominates the cost:
#: ``--quick`` maps the Transformer (the dense ladder the crossover's goals hold on) at two rungs 650x apart
#: with three cheap techniques, and the vision ladder at xs, m, l; full adds sequence and vision to the map,
#: a middle rung, channel pruning, and the s rung and more rounds to the ladder.
QUICK_WORKLOADS, FULL_WORKLOADS = ("transformer",), ("sequence", "vision", "transformer")
QUICK_MAP_RUNGS, FULL_MAP_RUNGS = ("xs", "l"), ("xs", "m", "l")
QUICK_TECHNIQUES, FULL_TECHNIQUES = ("bf16", "int8_eager", "fused_optim"), \
    ("bf16", "int8_eager", "prune_channels50", "fused_optim")
#: (rungs, rounds, steps per run). The vision xl rung (11 M parameters, a stride-1 stem) costs ~5 s per step at
#: 2 threads here, so rounds of it alone would exceed the 10 min budget; pass ``ladder_rungs`` to add it.
QUICK_LADDER, FULL_LADDER = (("xs", "m", "l"), 3, 6), (("xs", "s", "m", "l"), 4, 10)
PAYS, LOSES, UNCLEAR, NO_VERDICT = "pays", "loses", "no clear effect", "no verdict"


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def verdict(lo: float | None, hi: float | None) -> str:
    """``pays`` when the CI is above 1, ``loses`` when below, else ``no clear effect``; no CI: no verdict."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return NO_VERDICT
    return PAYS if lo > 1 else LOSES if hi < 1 else UNCLEAR


def fmt_x(v: float | None) -> str:
    return "—" if v is None or not math.isfinite(v) else f"x{v:.2f}"


def _scaling_why(scaling: float | None, n: int, regime: str | None) -> str:
    tag = f"{regime} at 1 thread; " if regime else ""
    if scaling is None:
        return tag + "not measured at both thread counts"
    if scaling < 0.9 and regime == "compute-bound":
        return tag + (f"slower with {n} threads ({fmt_x(scaling)}) although there is arithmetic to split: the "
                      "threads wait for cores that other load holds (a shared machine), not for work")
    if scaling < 0.9:
        return tag + (f"slower with {n} threads ({fmt_x(scaling)}): too little work per operator to split, so "
                      "the threads' synchronisation (and any other load on the cores) costs more than it saves")
    if scaling < 1.2:
        return tag + (f"the extra cores buy little ({fmt_x(scaling)}): per-operator dispatch, not arithmetic, sets "
                      "the step, and dispatch does not split across threads")
    if scaling < 0.8 * n:
        return tag + (f"partly parallel ({fmt_x(scaling)} of an ideal x{n}): the arithmetic splits, the overhead "
                      "does not")
    return tag + f"compute-bound: the arithmetic splits across threads ({fmt_x(scaling)} of an ideal x{n})"


def _index(the_map: dict[str, Any]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    return {(r["workload"], r["rung"], r["technique"], r["axis"]): r for r in the_map["rows"]}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def compare_maps(map_1: dict[str, Any], map_n: dict[str, Any]) -> dict[str, Any]:
    """Compare a map built at 1 thread with one built at N threads (same workloads and rungs; pure).

    Returns ``threads`` ([1, N]); ``scaling``: per workload x rung x axis the fp32 baseline's thread scaling
    (``base_ms`` at 1 thread / at N; a ratio of medians of two maps measured apart, so no CI) with a why;
    ``rows``: per workload x rung x technique x axis both speedups and CIs, both verdicts, the technique's own
    thread scaling, ``flipped`` and a why; ``crossovers``: each pair's measured crossover rung at 1 and at N
    threads; ``flips`` and ``headline`` (sentences). Only keys present in both maps are compared."""
    t1, tn = int(map_1.get("threads") or 1), int(map_n.get("threads") or 1)
    if t1 >= tn:
        raise ValueError(f"compare_maps needs the 1-thread map first and a map at more threads; got threads "
                         f"{t1} and {tn}")
    one, many = _index(map_1), _index(map_n)
    keys = [k for k in one if k in many]
    if not keys:
        raise ValueError("the two maps share no workload x rung x technique x axis row")
    scaling, seen = [], set()
    for wl, rung, tech, axis in keys:
        a, b = one[(wl, rung, tech, axis)], many[(wl, rung, tech, axis)]
        if tech == "workers1" or (wl, rung, axis) in seen or a["base_ms"] is None or b["base_ms"] is None:
            continue  # the workers row's base is its own loader-fed step, not the shared fp32 one
        seen.add((wl, rung, axis))
        s = _ratio(a["base_ms"], b["base_ms"])
        scaling.append({"workload": wl, "rung": rung, "axis": axis, "params": a["params"],
                        "macs_per_sample": a["macs_per_sample"], "base_ms_1": a["base_ms"], "base_ms_n": b["base_ms"],
                        "scaling": s, "regime_1": a.get("regime"), "regime_n": b.get("regime"),
                        "why": _scaling_why(s, tn, a.get("regime"))})
    rows = []
    for key in keys:
        a, b = one[key], many[key]
        wl, rung, tech, axis = key
        v1, vn = verdict(a["ci_lo"], a["ci_hi"]), verdict(b["ci_lo"], b["ci_hi"])
        bs, ts = _ratio(a["base_ms"], b["base_ms"]), _ratio(a["tech_ms"], b["tech_ms"])
        flipped = NO_VERDICT not in (v1, vn) and v1 != vn
        if a["speedup"] is None or b["speedup"] is None:
            why = "not measured at both thread counts: " + ((a.get("why") if a["speedup"] is None else b.get("why"))
                                                            or "skipped")[:160]
        else:
            why = (f"{fmt_x(a['speedup'])} at 1 thread, {fmt_x(b['speedup'])} at {tn}: the {tech} "
                   f"{'step' if axis == 'train_step' else 'call'} gets {fmt_x(ts)} from {tn} threads, its baseline "
                   f"{fmt_x(bs)}" + (f"; the verdict flips ({v1} -> {vn})" if flipped else ""))
        rows.append({"workload": wl, "rung": rung, "params": a["params"], "macs_per_sample": a["macs_per_sample"],
                     "technique": tech, "axis": axis, "speedup_1": a["speedup"], "ci_1": [a["ci_lo"], a["ci_hi"]],
                     "speedup_n": b["speedup"], "ci_n": [b["ci_lo"], b["ci_hi"]], "verdict_1": v1, "verdict_n": vn,
                     "base_scaling": bs, "tech_scaling": ts, "flipped": flipped,
                     "reversed": flipped and {v1, vn} == {PAYS, LOSES}, "why": why})
    cross_n = {(c["workload"], c["technique"], c["axis"]): c for c in map_n.get("crossovers", [])}
    crossovers = [{"workload": c["workload"], "technique": c["technique"], "axis": c["axis"],
                   "measured_rung_1": c.get("measured_rung"), "measured_params_1": c.get("measured_params"),
                   "measured_rung_n": cross_n[k].get("measured_rung"),
                   "measured_params_n": cross_n[k].get("measured_params"),
                   "moved": c.get("measured_rung") != cross_n[k].get("measured_rung")}
                  for c in map_1.get("crossovers", []) if (k := (c["workload"], c["technique"], c["axis"])) in cross_n]
    flips = [r for r in rows if r["flipped"]]
    return {"threads": [t1, tn], "scaling": scaling, "rows": rows, "crossovers": crossovers, "flips": flips,
            "headline": _headline(rows, flips, scaling, crossovers, tn)}


def _headline(rows: list[dict[str, Any]], flips: list[dict[str, Any]], scaling: list[dict[str, Any]],
              crossovers: list[dict[str, Any]], tn: int) -> list[str]:
    judged = [r for r in rows if NO_VERDICT not in (r["verdict_1"], r["verdict_n"])]
    out = [f"{len(flips)} of {len(judged)} technique verdicts (workload x rung x axis) flip between 1 and {tn} threads"
           f" ({sum(r['reversed'] for r in flips)} of them from pays to loses or back)"]
    for r in flips:
        out.append(f"  {r['workload']} {r['rung']} ({r['params']:,} params) {r['technique']} "
                   f"{r['axis'].replace('_', ' ')}: {r['verdict_1']} at 1 thread ({fmt_x(r['speedup_1'])}) -> "
                   f"{r['verdict_n']} at {tn} ({fmt_x(r['speedup_n'])})")
    for wl in dict.fromkeys(s["workload"] for s in scaling):
        mine = sorted((s for s in scaling if s["workload"] == wl and s["axis"] == "train_step"),
                      key=lambda s: s["params"])
        if mine:
            out.append(f"  fp32 train step with {tn} threads, {wl}: " + ", ".join(
                f"{s['rung']} {fmt_x(s['scaling'])}" for s in mine))
    moved = [c for c in crossovers if c["moved"]]
    out.append(f"{len(moved)} of {len(crossovers)} measured crossovers move to another rung at {tn} threads"
               + "".join(f"; {c['workload']} {c['technique']} {c['axis'].replace('_', ' ')}: "
                         f"{c['measured_rung_1'] or 'never'} -> {c['measured_rung_n'] or 'never'}" for c in moved))
    return out


def ladder_why(row: dict[str, Any], cores: int) -> str:
    """Why the worker pair won or lost at this rung, from the row's own evidence: whether the all-cores step
    itself got slower (compute threads preempted), or the step waited for data (loader-bound)."""
    a, w = row["pairs"]["all_cores"], row["pairs"]["worker"]
    ca, cw, wait = row["compute_ms_per_step"], row["compute_ms_per_step_worker"], a["data_wait_fraction"] or 0.0
    facts = (f"read + decode {row['loader_ms_per_batch']:.3g} ms per batch; compute {ca:.3g} ms per step at {cores} "
             f"threads, {cw:.3g} ms at {cores - 1}; data wait {100 * wait:.0f}% with the prefetcher, "
             f"{100 * (w['data_wait_fraction'] or 0.0):.0f}% with the worker")
    v = row["verdict"]
    if v == PAYS and ca > 1.1 * cw:
        return (f"the {cores}-thread step is slower than the {cores - 1}-thread one: decoding in a thread of the "
                f"training process (and any other load) preempts a compute thread, and the others wait for it at "
                f"every barrier; a worker process takes the decoding off those threads. {facts}")
    if v == PAYS:
        return f"loader-bound: the step waits for data with the prefetcher; a worker decodes beside it. {facts}"
    if v == LOSES:
        return f"compute-bound: the core is worth more to the step than to decoding. {facts}"
    if v == UNCLEAR:
        return f"within noise. {facts}"
    return f"fewer than {MIN_SAMPLES} samples per pair: no interval, no verdict. {facts}"


def workers_along_ladder(workload: str = "vision", rungs: Sequence[str] | None = None, *,
                         run: Callable[[RunConfig], Any], cores: int | None = None, size: str = "small",
                         storage: str = "network_fs", repeats: int = 3, max_steps: int = 10, warmup_steps: int = 2,
                         progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Per rung of ``workload``'s ladder, file-backed, "all cores compute + thread prefetcher" against
    "cores-1 compute threads + 1 DataLoader worker" (:func:`lab.data.studies.threads.workers_vs_threads`,
    interleaved, ``repeats`` rounds of ``max_steps``-step runs through ``run``, e.g. :func:`lab.train.run`).

    Rows: params and MACs per sample (from the runs' own counts), loader ms per batch, compute ms per step,
    ``ratio`` = worker pair's throughput / all-cores pair's with its bootstrap 95 % CI, the verdict for the
    worker, and the lab rule's pick. ``answer``: the smallest rung from which giving a core to a loader
    worker stops paying (the ratio's CI lower bound is not above 1 there and at every larger rung)."""
    cores = cores or usable_cores()
    if cores < 2:
        raise ValueError(f"cores={cores}: workers vs threads needs >= 2 cores to split between loader and compute")
    wl = get_workload(workload)
    rungs = list(rungs or wl.rungs())
    bad = [r for r in rungs if r not in wl.scales]
    if bad or not rungs:
        raise ValueError(f"rung(s) {', '.join(bad) or '(none)'} not on {workload!r}'s ladder: "
                         f"{', '.join(wl.rungs()) or 'it has none'}")
    if repeats < 1 or max_steps <= warmup_steps:
        raise ValueError(f"repeats={repeats}, max_steps={max_steps}, warmup_steps={warmup_steps}: need repeats >= 1 "
                         "and max_steps > warmup_steps")
    all_pair, worker_pair = (cores, 0), (cores - 1, 1)
    rows = []
    for rung in sorted(rungs, key=SCALE_NAMES.index):
        seen: dict[str, Any] = {}

        def recording(cfg: RunConfig, seen: dict[str, Any] = seen) -> Any:
            res = run(cfg)
            seen.setdefault("params", getattr(res, "param_count", None))
            seen.setdefault("macs", getattr(res, "macs_per_sample", None))
            if getattr(res, "status", "ok") != "ok":
                seen["error"] = getattr(res, "error", None) or res.status
            return res

        if progress:
            progress(f"{workload} {rung}: {cores} threads + prefetcher vs {cores - 1} thread(s) + 1 worker, "
                     f"{repeats} rounds of {max_steps} steps")
        base = RunConfig(workload=workload, size=size, model_scale=rung, max_steps=max_steps, epochs=1,
                         warmup_steps=warmup_steps, latency_repeats=0, device="cpu")
        study = workers_vs_threads(base, [all_pair, worker_pair], run=recording, storage=storage, repeats=repeats)
        by = {(r["threads"], r["workers"]): r for r in study["rows"]}
        a, w = by[all_pair], by[worker_pair]
        enough = min(len(a["samples"]), len(w["samples"])) >= MIN_SAMPLES and "error" not in seen
        est, lo, hi = bootstrap_ratio_ci(w["samples"], a["samples"])
        v = verdict(lo, hi) if enough else NO_VERDICT
        rule = recommend(cores, w["loader_ms_per_batch"], w["compute_ms_per_step"])
        pick = (rule["threads"], rule["workers"])
        winner = worker_pair if v == PAYS else all_pair if v == LOSES else None
        pairs = {"all_cores": a, "worker": w}
        rows.append({
            "workload": workload, "rung": rung, "params": seen.get("params"), "macs_per_sample": seen.get("macs"),
            "loader_ms_per_batch": w["loader_ms_per_batch"], "compute_ms_per_step": a["compute_ms_per_step"],
            "compute_ms_per_step_worker": w["compute_ms_per_step"],
            "ratio": est, "ci95": [lo, hi] if enough else None, "verdict": v,
            "pairs": {k: {"threads": p["threads"], "workers": p["workers"], "throughput": p["throughput"],
                          "data_wait_fraction": p["data_wait_fraction"], "samples": p["samples"]}
                      for k, p in pairs.items()},
            "rule": {"threads": rule["threads"], "workers": rule["workers"], "text": rule["text"]},
            "rule_measured": pick in (all_pair, worker_pair),
            "rule_agrees": None if winner is None or pick not in (all_pair, worker_pair) else pick == winner,
            "error": seen.get("error")})
        rows[-1]["why"] = ladder_why(rows[-1], cores)
    return {"workload": workload, "size": size, "storage": storage, "cores": cores, "repeats": repeats,
            "max_steps": max_steps, "pairs": [list(all_pair), list(worker_pair)], "rows": rows,
            "answer": stops_paying(rows)}


def stops_paying(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The smallest rung from which a loader worker stops paying: its ratio's CI lower bound is not above 1
    (``pays`` never again) at that rung and every larger one; also where it clearly costs (CI below 1 from
    there on). Rows without a verdict cannot show a worker paying, so they count as "not paying"."""
    def first_from(flags: list[bool]) -> int | None:  # the start of the run of True that reaches the end
        i = len(flags)
        while i > 0 and flags[i - 1]:
            i -= 1
        return i if i < len(flags) else None

    def at(i: int | None) -> dict[str, Any] | None:
        return None if i is None else {k: rows[i][k] for k in ("rung", "params", "macs_per_sample")}

    stop = first_from([r["verdict"] != PAYS for r in rows])
    cost = first_from([r["verdict"] == LOSES for r in rows])
    if not rows:
        text = "nothing measured"
    elif stop is None:
        text = f"giving a core to a loader worker pays at every rung measured (up to {rows[-1]['rung']}, " \
               f"{rows[-1]['params'] or 0:,} params)"
    elif stop == 0:
        text = f"a loader worker does not pay at any rung measured ({rows[0]['rung']} .. {rows[-1]['rung']})"
    else:
        text = (f"a loader worker pays up to {rows[stop - 1]['rung']} ({rows[stop - 1]['params'] or 0:,} params) and "
                f"stops paying from {rows[stop]['rung']} ({rows[stop]['params'] or 0:,} params, "
                f"{(rows[stop]['macs_per_sample'] or 0) / 1e6:.3g} MMACs/sample)")
    if cost is not None:
        text += f"; it clearly costs from {rows[cost]['rung']} on"
    return {"stops_paying_from": at(stop), "costs_from": at(cost), "text": text,
            "rule_picks": {r["rung"]: f"{r['rule']['threads']} thread(s) + {r['rule']['workers']} worker(s)"
                           for r in rows}}
