"""What fits in a memory budget: the largest batch whose measured peak is under it, found by trying.

"Does my model train on an 8 GB GPU, and at which batch" is answered by real batches, not a formula: each try is
a short run (``max_steps`` steps, no latency, no evaluation) in a fresh process, so one try's allocations never
pin the next one's peak. The peak is CUDA's ``max_memory_allocated`` on a GPU, and on CPU the process's peak
RSS (``ru_maxrss``: the data, the model and the step together, what the machine must hold). The search
doubles from the config's batch while the peak fits (halves while it does not), then bisects between the last
batch that fits and the first that does not until they are within ``tolerance``; the answer's next doubling is
measured too (``doubling_peak_mb``), so "under the budget, and twice it is over" is a measurement. The batch is
capped by the training split (a larger one would read the same rows).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from lab.config import RunConfig

#: Steps per try: the warm-up plus a few measured ones (the peak is the step's, reached in the first steps).
TRY_STEPS, TRY_WARMUP = 6, 2
MAX_TRIES = 16
TryFn = Callable[[RunConfig], dict[str, Any]]


def try_batch(cfg: RunConfig) -> dict[str, Any]:
    """One try in a fresh process: ``{"peak_mb", "kind", "step_ms", "samples_per_s", "n_train"}``."""
    code = "import sys; from lab.ablation.memory_fit import _child; _child(sys.argv[1])"
    out = subprocess.run([sys.executable, "-c", code, json.dumps(cfg.to_dict())], capture_output=True, text=True,
                         timeout=900, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if out.returncode != 0:
        raise RuntimeError(f"memory try at batch {cfg.batch_size} failed: {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(cfg_json: str) -> None:
    import resource

    from lab.train import run

    r = run(RunConfig.from_dict(json.loads(cfg_json)))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1.0 if sys.platform == "darwin" else 1024.0) / 2**20
    print(json.dumps({"peak_mb": r.peak_memory_mb if r.memory_kind == "cuda" else rss, "kind": r.memory_kind,
                      "sampled_peak_mb": r.peak_memory_mb, "step_ms": r.median_step_ms,
                      "samples_per_s": r.throughput_samples_per_s, "n_train": r.details["resolved"]["n_train"],
                      "status": r.status}))


def largest_batch(cfg: RunConfig, budget_mb: float, *, tolerance: float = 0.05, try_fn: TryFn | None = None,
                  start: int | None = None) -> dict[str, Any]:
    """``{"batch", "peak_mb", "step_ms", "samples_per_s", "doubling", "doubling_peak_mb", "tries", "bound"}``:
    the largest batch (within ``tolerance`` of the true edge) whose peak is <= ``budget_mb``; ``batch`` None when
    not even batch 1 fits. ``try_fn`` (default :func:`try_batch`) measures one config; tests pass a fake."""
    if not budget_mb > 0:
        raise ValueError(f"memory_budget={budget_mb} is invalid: allowed: a number of MB > 0")
    try_fn = try_fn or try_batch
    tried: dict[int, dict[str, Any]] = {}
    n_train: list[int] = []

    def measure(b: int) -> dict[str, Any]:
        if b not in tried:
            if len(tried) >= MAX_TRIES:
                raise RuntimeError(f"memory search took more than {MAX_TRIES} tries")
            # epochs=TRY_STEPS: even a batch of the whole split takes TRY_STEPS steps
            c = cfg.with_overrides(batch_size=b, epochs=TRY_STEPS, max_steps=TRY_STEPS, warmup_steps=TRY_WARMUP,
                                   latency_repeats=0, eval_every=None, target_metric=None, profile=False)
            tried[b] = try_fn(c)
            n_train[:] = [int(tried[b].get("n_train") or 1 << 20)]
        return tried[b]

    def fits(b: int) -> bool:
        return measure(b)["peak_mb"] <= budget_mb

    if start is None and cfg.batch_size is None:  # the workload's own batch for the size
        from lab.context import resolve

        start = resolve(cfg).batch_size
    b = max(1, start or cfg.batch_size)
    bound = None
    if fits(b):
        lo, hi = b, None
        while hi is None:
            nxt = min(lo * 2, n_train[0])
            if nxt == lo:
                bound = f"the training split ({n_train[0]} rows): every batch fits"
                break
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        hi, lo = b, None
        while lo is None and hi > 1:
            if fits(hi // 2):
                lo = hi // 2
            else:
                hi //= 2
        if lo is None:
            return {"batch": None, "budget_mb": budget_mb, "peak_mb": measure(1)["peak_mb"], "tries": _rows(tried),
                    "bound": "not even batch 1 fits"}
    while hi is not None and hi - lo > max(1, int(lo * tolerance)):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    best = measure(lo)
    doubling = min(2 * lo, n_train[0])
    double = measure(doubling) if doubling != lo else None
    return {"batch": lo, "budget_mb": budget_mb, "peak_mb": best["peak_mb"], "kind": best.get("kind"),
            "step_ms": best.get("step_ms"), "samples_per_s": best.get("samples_per_s"), "doubling": doubling,
            "doubling_peak_mb": double["peak_mb"] if double else None, "bound": bound, "tries": _rows(tried)}


def _rows(tried: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"batch": b, "peak_mb": t["peak_mb"], "step_ms": t.get("step_ms")} for b, t in sorted(tried.items())]


def format_fit(found: dict[str, Any]) -> str:
    head = f"memory budget {found['budget_mb']:.6g} MB"
    if found["batch"] is None:
        return f"{head}: {found['bound']} (batch 1 peaks at {found['peak_mb']:.4g} MB)"
    line = (f"{head}: largest batch {found['batch']} (peak {found['peak_mb']:.4g} MB {found.get('kind') or ''}, "
            f"step {found['step_ms']:.3g} ms, {found['samples_per_s']:.4g} samples/s)")
    if found.get("doubling_peak_mb") is not None:
        line += f"; batch {found['doubling']} peaks at {found['doubling_peak_mb']:.4g} MB"
    if found.get("bound"):
        line += f"; bounded by {found['bound']}"
    return line + "\n  tried: " + ", ".join(f"{t['batch']}: {t['peak_mb']:.4g} MB" for t in found["tries"])


__all__ = ["MAX_TRIES", "format_fit", "largest_batch", "try_batch"]
