"""Loader workers against compute threads: how to split a small machine's cores between decoding and the step.

Why: on a 2-core box a DataLoader worker that decodes images and the intra-op threads of the forward and
backward pass compete for the same two cores. More compute threads speed the step only if the loader keeps
up; more workers help only while the step waits for data, and each one takes a core from compute. Which pair
wins depends on the decode cost per batch against the compute per step, so the lab measures it
(:func:`workers_vs_threads`, ``benchmarks/data_threads.py``, notebook 01, the dashboard's "Workers vs threads"
page) and states a rule for a run (:func:`recommend`), printed in every file-backed run's record.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from lab.config import DataConfig, RunConfig
from lab.measure import bootstrap_ratio_ci, median


def recommend(cores: int, loader_ms_per_batch: float, compute_ms_per_step: float) -> dict[str, Any]:
    """The rule: enough loader workers that their combined rate keeps up with the step
    (``ceil(loader_ms / compute_ms)``, at least 1 when there is loader work), the remaining cores to compute
    (at least 1). With a single core there is nothing to split: one thread, a thread prefetcher."""
    if cores < 1:
        raise ValueError(f"cores={cores!r} is invalid: must be >= 1")
    if cores == 1:
        workers, threads = 0, 1
    else:
        need = math.ceil(loader_ms_per_batch / max(compute_ms_per_step, 1e-9)) if loader_ms_per_batch > 0 else 0
        workers = min(max(need, 1 if loader_ms_per_batch > 0 else 0), cores - 1)
        threads = max(1, cores - workers)
    text = (f"on {cores} core(s) with {loader_ms_per_batch:.3g} ms of read + decode per batch and "
            f"{compute_ms_per_step:.3g} ms of compute per step: {threads} compute thread(s) + {workers} loader "
            f"worker(s)" + (" (--loader dataloader --data-num-workers "
                            f"{workers} --threads {threads})" if workers else " (--loader thread)"))
    return {"threads": threads, "workers": workers, "text": text}


def pair_config(base: RunConfig, threads: int, workers: int, storage: str) -> RunConfig:
    """One grid point: ``threads`` compute threads, ``workers`` DataLoader worker processes (0: a thread
    prefetcher in the training process), reading the file-backed source from ``storage``."""
    data = (DataConfig(source="files", loader="dataloader", storage=storage, num_workers=workers,
                       prefetch_factor=2) if workers else
            DataConfig(source="files", loader="thread", storage=storage, prefetch_depth=2))
    return dataclasses.replace(base, threads=threads, data=data)


def default_pairs(cores: int | None = None) -> list[tuple[int, int]]:
    """(threads, workers) with threads + workers <= cores + 1 (one oversubscribed pair shows the cost)."""
    cores = cores or os.cpu_count() or 1
    return [(t, w) for t in range(1, cores + 1) for w in range(0, cores + 1) if t + w <= cores + 1]


def workers_vs_threads(base: RunConfig, pairs: Sequence[tuple[int, int]], *, run: Callable[[RunConfig], Any],
                       storage: str = "network_fs", repeats: int = 3) -> dict[str, Any]:
    """Each (threads, workers) pair trained ``repeats`` times, interleaved, through ``run`` (:func:`lab.run`,
    passed in because this study sits below it):
    throughput per pair with a bootstrap CI of its ratio to the best pair, the data wait, and the CPU seconds
    the loader workers and the training process spent. Returns rows, the best pair and the rule's pick."""
    samples: dict[tuple[int, int], list[dict[str, float]]] = {p: [] for p in pairs}
    for _ in range(repeats):
        for p in pairs:
            res = run(pair_config(base, *p, storage))
            data = res.details.get("data", {})
            by_worker = data.get("loader_cpu_s_by_worker", {})
            samples[p].append({
                "throughput": res.throughput_samples_per_s or 0.0, "wait": res.data_wait_fraction or 0.0,
                "loader_ms": data.get("read_ms_per_batch", 0.0) + data.get("decode_ms_per_batch", 0.0),
                "compute_ms": res.ideal_step_ms or 0.0,
                "worker_cpu_s": sum(v for k, v in by_worker.items() if k != "-1"),
                "main_loader_cpu_s": by_worker.get("-1", 0.0),
                "process_cpu_s": data.get("process_cpu_s", 0.0)})
    thr = {p: [s["throughput"] for s in samples[p]] for p in pairs}
    best = max(pairs, key=lambda p: median(thr[p]))
    rows = []
    for p in pairs:
        ratio, lo, hi = bootstrap_ratio_ci(thr[p], thr[best])
        col = {k: median([s[k] for s in samples[p]]) for k in samples[p][0]}
        rows.append({"threads": p[0], "workers": p[1], "throughput": col["throughput"], "vs_best": ratio,
                     "vs_best_ci95": [lo, hi], "data_wait_fraction": col["wait"],
                     "loader_ms_per_batch": col["loader_ms"], "compute_ms_per_step": col["compute_ms"],
                     "worker_cpu_s": col["worker_cpu_s"], "training_process_cpu_s": col["process_cpu_s"],
                     "in_process_loader_cpu_s": col["main_loader_cpu_s"], "samples": thr[p]})
    ref = next(r for r in rows if r["workers"] >= 1) if any(r["workers"] for r in rows) else rows[0]
    rule = recommend(os.cpu_count() or 1, ref["loader_ms_per_batch"], ref["compute_ms_per_step"])
    rule_row = next((r for r in rows if (r["threads"], r["workers"]) == (rule["threads"], rule["workers"])), None)
    return {"rows": rows, "best": {"threads": best[0], "workers": best[1], "throughput": median(thr[best])},
            "rule": rule, "rule_vs_best": rule_row["vs_best"] if rule_row else None, "storage": storage,
            "workload": base.workload, "size": base.size}


def grid_rows(study: dict[str, Any]) -> list[dict[str, Any]]:
    """The grid as table rows (what the dashboard page and notebook 01 show)."""
    return [{"threads": r["threads"], "workers": r["workers"], "samples/s": round(r["throughput"], 1),
             "x best": round(r["vs_best"], 3), "CI95": f"[{r['vs_best_ci95'][0]:.2f}, {r['vs_best_ci95'][1]:.2f}]",
             "data wait %": round(100 * r["data_wait_fraction"], 1),
             "worker CPU s": round(r["worker_cpu_s"], 2),
             "training process CPU s": round(r["training_process_cpu_s"], 2)}
            for r in study["rows"]]


def load_grids(path: str | os.PathLike[str] | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """The grids of the committed ``data_threads`` benchmark for this machine (or ``path``): ([], None) if none."""
    import json
    from pathlib import Path

    from lab.measure import environment_stamp

    if path is None:
        root = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
        path = root / str(environment_stamp().get("hardware_id", "unknown")) / "data_threads.json"
    path = Path(path)
    if not path.is_file():
        return [], None
    return json.loads(path.read_text()).get("grids", []), str(path)
