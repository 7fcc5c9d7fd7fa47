"""Stall analysis: how much of each step waits for data, and what the best loader could reach.

Why: "the GPU is slow" and "the loader is slow" look the same from the outside (low throughput). The
per-step phase timings every run records (``RunResult.step_times_ms``) separate them: ``data_wait`` is the
time from asking for a batch to having it on the device. The Amdahl bound says what fixing the loader can
buy: with I/O spread over ``parallelism`` readers that overlap compute, a step costs max(T_compute,
T_io / parallelism), never less than the compute alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch import nn

from lab.config import RunConfig
from lab.context import TrainContext, prepare
from lab.loop import FitStats, StepHook

COMPUTE_PHASES = ("forward", "backward", "optimizer", "comm")


def _phase(step_times_ms: dict[str, list[float]], name: str, skip: int) -> np.ndarray:
    return np.asarray(step_times_ms.get(name, [])[skip:], dtype=np.float64)


def data_wait_fraction(step_times_ms: dict[str, list[float]], *, skip: int = 1) -> float:
    """Share of the step time spent waiting for data (first ``skip`` steps dropped: they include startup)."""
    wait = _phase(step_times_ms, "data_wait", skip).sum()
    total = wait + sum(_phase(step_times_ms, p, skip).sum() for p in COMPUTE_PHASES)
    if total <= 0:
        raise ValueError("step_times_ms holds no steps after skip; run more steps or lower skip")
    return float(wait / total)


def stall_summary(step_times_ms: dict[str, list[float]], *, skip: int = 1) -> dict[str, float]:
    """Median per-step data wait and compute, the wait fraction, and the compute-only bound."""
    wait = _phase(step_times_ms, "data_wait", skip)
    compute = sum(_phase(step_times_ms, p, skip) for p in COMPUTE_PHASES if step_times_ms.get(p))
    return {"data_wait_ms": float(np.median(wait)), "compute_ms": float(np.median(compute)),
            "data_wait_fraction": data_wait_fraction(step_times_ms, skip=skip),
            "ideal_step_ms": float(np.median(compute))}


def amdahl_step_ms(compute_ms: float, io_ms: float, parallelism: int) -> float:
    """Best step time when I/O of ``io_ms`` per batch runs on ``parallelism`` readers overlapping compute."""
    if parallelism < 1:
        raise ValueError(f"parallelism={parallelism!r} is invalid: must be >= 1")
    return max(compute_ms, io_ms / parallelism)


def prefetch_memory_mb(batch_bytes: int, depth: int, num_workers: int = 0) -> float:
    """Memory the loader holds ahead of training: ``depth`` batches per reader (a DataLoader holds
    ``prefetch_factor`` per worker). This is the cost of a deep buffer the seed warns about."""
    return batch_bytes * depth * max(num_workers, 1) / 1e6


class CachedLoader:
    """Replays batches already read (``batches``) in order: a loader that costs nothing, for the ideal bound."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def set_epoch(self, epoch: int) -> None:
        pass  # the replay is of one fixed sequence of steps

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def replay_cached(ctx: TrainContext, steps: int,
                  prepared: Callable[[], tuple[nn.Module, list[StepHook]]] | None = None, *, phase: str = "train",
                  fewest: int = 0) -> FitStats | None:
    """The ideal replay, the one place it is written: read up to ``steps`` batches through the run's loader
    first (untimed), then train ``prepared()``'s model with its step hooks (default: a fresh copy of the run's
    model through every technique's ``before_training``; none wraps for several processes there) on exactly
    those batches from memory, through the run's own ``ctx.fit`` (its optimizer, precision policy, fast kernels
    and compile).
    ``None``, before any model is built, when the loader gave fewer than ``fewest`` batches."""
    loader = ctx.make_loader()
    loader.set_epoch(0)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == steps:
            break
    if len(batches) < fewest:
        return None
    model, hooks = prepared() if prepared is not None else ctx.techniques.before_training(ctx, ctx.new_model())
    return ctx.fit(model, epochs=1, lr=ctx.resolved.lr, max_steps=len(batches), step_hooks=hooks,
                   loader=CachedLoader(batches), phase=phase)


def ideal_replay(cfg: RunConfig, steps: int) -> dict[str, float]:
    """The compute-only bound for ``cfg`` (:func:`replay_cached` in a context of its own), timed. The gap
    between a run's median step and this one is what any loader improvement can still win."""
    if steps < 2:
        raise ValueError(f"steps={steps!r} is invalid: must be >= 2 (the first step is dropped as warm-up)")
    with prepare(cfg) as ctx:
        stats = replay_cached(ctx, steps)
    assert stats is not None  # fewest=0: never None
    out: dict[str, Any] = stall_summary(stats.step_times_ms)
    out["ideal_step_ms"] = out["compute_ms"] + out["data_wait_ms"]
    out["step"] = ctx.result.details["steps"]["train"]  # what the replayed step was made of
    return out
