"""Auto-tuner: pick loader workers × prefetch depth (× compute threads) by measuring, under a memory cap.

Why: the seed chose "prefetch depth 2× batch" by experiment; this automates the experiment. Deeper buffers
and more workers help only until the loader outruns compute, and each costs memory (held batches, worker
processes) and cores that compute also wants. The tuner measures each candidate that fits the cap, keeps the
fastest, and among candidates within ``tolerance`` of it takes the cheapest in memory — and says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lab.config import DataConfig
from lab.data.studies.stalls import prefetch_memory_mb


@dataclass(frozen=True)
class Candidate:
    num_workers: int  # 0 = a thread prefetcher in the main process
    depth: int  # thread prefetcher depth, or DataLoader prefetch_factor per worker
    threads: int = 1  # compute threads

    def memory_mb(self, batch_bytes: int, worker_overhead_mb: float) -> float:
        return prefetch_memory_mb(batch_bytes, self.depth, self.num_workers) + self.num_workers * worker_overhead_mb


def autotune(measure: Callable[[Candidate], float], batch_bytes: int, *, memory_cap_mb: float,
             workers: Sequence[int] = (0, 1, 2), depths: Sequence[int] = (1, 2, 4, 8),
             threads: Sequence[int] = (1,), worker_overhead_mb: float = 100.0, tolerance: float = 0.03,
             repeats: int = 1) -> dict:
    """``measure(candidate)`` returns throughput (samples/s); each candidate is measured ``repeats`` times,
    interleaved, and scored by the median (one noisy run on a shared box must not decide). Returns the
    pick, the table and a reason."""
    if memory_cap_mb <= 0:
        raise ValueError(f"memory_cap_mb={memory_cap_mb!r} is invalid: must be > 0")
    if repeats < 1:
        raise ValueError(f"repeats={repeats!r} is invalid: must be >= 1")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance={tolerance!r} is invalid: must be in [0, 1)")
    rows = []
    for w in workers:
        for d in depths:
            for t in threads:
                c = Candidate(w, d, t)
                mem_mb = c.memory_mb(batch_bytes, worker_overhead_mb)
                rows.append({"candidate": c, "memory_mb": mem_mb, "fits": mem_mb <= memory_cap_mb,
                             "samples": []})
    for _ in range(repeats):  # interleaved: drift on a shared box hits every candidate alike
        for r in rows:
            if r["fits"]:
                r["samples"].append(measure(r["candidate"]))
    for r in rows:
        r["throughput"] = float(np.median(r["samples"])) if r["samples"] else None
    ok = [r for r in rows if r["fits"]]
    if not ok:
        raise ValueError(f"memory_cap_mb={memory_cap_mb} is invalid: no candidate fits (smallest needs "
                         f"{min(r['memory_mb'] for r in rows):.1f} MB)")
    best = max(r["throughput"] for r in ok)
    near = [r for r in ok if r["throughput"] >= (1 - tolerance) * best]
    pick = min(near, key=lambda r: (r["memory_mb"], r["candidate"].num_workers, r["candidate"].depth))
    c = pick["candidate"]
    skipped = sum(not r["fits"] for r in rows)
    reason = (f"workers={c.num_workers}, depth={c.depth}, threads={c.threads}: {pick['throughput']:.0f} samples/s, "
              f"within {tolerance:.0%} of the best measured ({best:.0f}) at the least memory "
              f"({pick['memory_mb']:.1f} MB of a {memory_cap_mb:.0f} MB cap); {skipped} candidate(s) over the cap "
              "were not run")
    return {"pick": c, "throughput": pick["throughput"], "memory_mb": pick["memory_mb"], "rows": rows,
            "reason": reason}


def data_config_for(c: Candidate, storage: str) -> DataConfig:
    """The ``DataConfig`` that runs candidate ``c``: a thread prefetcher for 0 workers, else a DataLoader."""
    if c.num_workers == 0:
        return DataConfig(loader="thread", storage=storage, prefetch_depth=c.depth)
    return DataConfig(loader="dataloader", storage=storage, num_workers=c.num_workers, prefetch_factor=c.depth,
                      persistent_workers=True)
