"""An alpha-beta model of ring all-reduce, calibrated on measured all-reduces and projected to N workers.

Why a model: this machine has 2 CPU cores, so the lab can only *measure* 1 and 2 ranks. What a 4-GPU or
1024-GPU run would gain depends on two numbers per link: alpha (seconds per message hop, the latency) and
beta (seconds per byte, one over the bandwidth). A ring all-reduce of S bytes over p workers does
2(p-1) hops, each carrying S/p bytes, so

    t(S, p) = 2 (p-1) * alpha + 2 (p-1)/p * S * beta

All functions are pure (numbers in, numbers out) so the notebook, the benchmark and the tests share them.
notebooks/05_distributed.ipynb draws the curves; benchmarks/distributed.py checks the fit against new
measurements (goal: within +-20 %).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from lab.store import ResultStore


@dataclass(frozen=True)
class Link:
    """One interconnect: latency per hop (alpha) and bandwidth per direction."""

    name: str
    alpha_s: float
    bandwidth_bytes_per_s: float

    @property
    def beta_s_per_byte(self) -> float:
        return 1.0 / self.bandwidth_bytes_per_s


#: Nominal figures (order of magnitude, per direction); real clusters reach 60-90 % of these.
LINK_PRESETS: dict[str, Link] = {
    "10GbE": Link("10GbE", 50e-6, 1.25e9),
    "25GbE": Link("25GbE", 25e-6, 3.125e9),
    "100GbE": Link("100GbE", 10e-6, 12.5e9),
    "InfiniBand HDR": Link("InfiniBand HDR", 2e-6, 25e9),
    "NVLink": Link("NVLink", 3e-6, 300e9),
}


def ring_allreduce_s(size_bytes: float, p: int, alpha_s: float, beta_s_per_byte: float) -> float:
    """Time of one ring all-reduce of ``size_bytes`` over ``p`` workers (0 for a single worker)."""
    if p < 1:
        raise ValueError(f"p={p} is invalid: the number of workers must be >= 1")
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * size_bytes * beta_s_per_byte


def calibrate(sizes_bytes: Sequence[float], times_s: Sequence[float], p: int) -> Link:
    """Least-squares fit of alpha and beta to measured all-reduce times at ``p`` workers.

    Why both small and large messages: small ones pin alpha (latency dominates), large ones pin beta.
    Both coefficients are clipped to be non-negative (a negative latency is noise, not physics)."""
    if p < 2:
        raise ValueError(f"p={p} is invalid: calibration needs measurements with >= 2 workers")
    if len(sizes_bytes) != len(times_s) or len(sizes_bytes) < 2:
        raise ValueError("calibrate needs >= 2 (size, time) pairs of equal length")
    s = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    a = np.column_stack([np.full_like(s, 2 * (p - 1)), 2 * (p - 1) / p * s])
    # Relative error matters (sizes span 4+ decades), so weight each row by 1/t.
    w = 1.0 / np.maximum(t, 1e-12)
    coef, *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    alpha, beta = max(float(coef[0]), 0.0), max(float(coef[1]), 1e-15)
    return Link("loopback (measured)", alpha, 1.0 / beta)


def comm_s_per_step(grad_bytes: float, p: int, link: Link, bucket_bytes: float) -> float:
    """All-reduce time per optimizer step when DDP sends the gradients in buckets of ``bucket_bytes``.

    Each bucket pays the latency term once: many small buckets cost more alpha, one huge bucket cannot
    overlap with backward. That trade-off is what DDP's ``bucket_cap_mb`` tunes."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes} is invalid: must be > 0")
    n_full, rest = divmod(grad_bytes, bucket_bytes)
    t = n_full * ring_allreduce_s(bucket_bytes, p, link.alpha_s, link.beta_s_per_byte)
    if rest > 0:
        t += ring_allreduce_s(rest, p, link.alpha_s, link.beta_s_per_byte)
    return t


def project(compute_s: float, grad_bytes: float, ps: Sequence[int], link: Link, *, bucket_bytes: float = 25e6,
            overlap: float = 0.0, backward_s: float | None = None) -> list[dict[str, float]]:
    """Speedup and efficiency of data parallelism at a fixed per-worker batch (how DDP is used).

    ``compute_s`` is one worker's step without communication. ``overlap`` (0..1) is the fraction of the
    backward pass that can hide communication (``backward_s`` defaults to 2/3 of compute). An epoch takes
    1/p as many steps, so speedup = p * compute / step(p); efficiency = speedup / p."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap={overlap} is invalid: allowed 0..1")
    if compute_s <= 0:
        raise ValueError(f"compute_s={compute_s} is invalid: must be > 0")
    bwd = compute_s * 2 / 3 if backward_s is None else backward_s
    rows = []
    for p in ps:
        comm = comm_s_per_step(grad_bytes, p, link, bucket_bytes)
        step = compute_s + max(comm - overlap * bwd, 0.0)
        speedup = p * compute_s / step
        rows.append({"p": p, "link": link.name, "comm_ms": comm * 1e3, "step_ms": step * 1e3,
                     "speedup": speedup, "efficiency": speedup / p})
    return rows


#: A projection is "validated" only while the model's worst held-out error stays within this (+-20 %).
VALIDATION_LIMIT = 0.20


def held_out_errors(sizes_bytes: Sequence[float], measured_s: Sequence[float], link: Link, p: int) -> list[float]:
    """Relative error (model - measured) / measured of the fitted model on all-reduces it was *not* fitted
    on: the number that says how far to trust any projection made with ``link``."""
    if len(sizes_bytes) != len(measured_s) or not sizes_bytes:
        raise ValueError("held_out_errors needs >= 1 (size, time) pairs of equal length")
    return [(ring_allreduce_s(s, p, link.alpha_s, link.beta_s_per_byte) - t) / t
            for s, t in zip(sizes_bytes, measured_s, strict=True)]


def trust(rel_error: float | None) -> str:
    """How to label a projection: ``validated (+-x %)`` while the worst held-out error is within
    :data:`VALIDATION_LIMIT`, else ``unvalidated``, with the error; ``not validated`` when never checked."""
    if rel_error is None or not math.isfinite(rel_error):
        return "not validated (no held-out check)"
    word = "validated" if abs(rel_error) <= VALIDATION_LIMIT else "unvalidated"
    return f"{word}: model misses held-out all-reduces by up to {abs(rel_error):.0%}"


def project_band(compute_s: float, grad_bytes: float, ps: Sequence[int], link: Link, rel_error: float, *,
                 bucket_bytes: float = 25e6, overlap: float = 0.0,
                 backward_s: float | None = None) -> list[dict[str, float]]:
    """:func:`project` with the band the model's own validation error puts around it: communication
    ``(1 - e)`` and ``(1 + e)`` times the modelled one give ``speedup_hi`` and ``speedup_lo``."""
    e = abs(rel_error)
    scaled = [Link(link.name, link.alpha_s * f, link.bandwidth_bytes_per_s / f) for f in (1 + e, max(1 - e, 1e-6))]
    rows = project(compute_s, grad_bytes, ps, link, bucket_bytes=bucket_bytes, overlap=overlap, backward_s=backward_s)
    slow, fast = (project(compute_s, grad_bytes, ps, lk, bucket_bytes=bucket_bytes, overlap=overlap,
                          backward_s=backward_s) for lk in scaled)
    for r, lo, hi in zip(rows, slow, fast, strict=True):
        r["speedup_lo"], r["speedup_hi"] = lo["speedup"], hi["speedup"]
    return rows


def powers_of_two(max_p: int = 1024) -> list[int]:
    """1, 2, 4, ..., max_p: the worker counts the curves are drawn at."""
    return [2 ** i for i in range(int(math.log2(max_p)) + 1)]


def step_of_stored_run(store: ResultStore, workload: str, size: str) -> dict[str, float | str] | None:
    """The inputs of a projection for ``workload`` at ``size``, from its newest stored single-process fp32 run: the
    measured median step (ms, all compute on one worker) and its fp32 gradient (MB: parameters x 4 bytes), with a
    sentence naming the run. None when no such run is stored (the Scaling tab then keeps its generic defaults and
    says so: its inputs had no tie to the workload the sidebar shows)."""
    from lab.result import RunResult

    rows = store.query("SELECT result_json FROM runs WHERE workload = ? AND status = 'ok' ORDER BY started_at DESC "
                       "LIMIT 200", (workload,))
    for (text,) in rows:
        r = RunResult.from_json(text)
        cfg = r.config or {}
        single = int((cfg.get("ddp") or {}).get("world_size") or 1) == 1
        fp32 = (cfg.get("precision") or {}).get("dtype", "fp32") == "fp32"
        if cfg.get("size") == size and single and fp32 and r.median_step_ms and r.param_count:
            return {"compute_ms": float(r.median_step_ms), "grad_mb": r.param_count * 4 / 1e6,
                    "said": f"run {r.run_id[:8]} of {workload} at size {size}: {r.median_step_ms:.3g} ms a step, "
                            f"{r.param_count:,} parameters"}
    return None
