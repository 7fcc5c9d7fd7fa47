"""What every part of the GPU benchmark shares: synchronised, interleaved timing; the figure helpers (ratio with
bootstrap CI, median, skipped); the ``gpu.json`` report rewritten after every part; a part's context (device,
sizes, deadline); and the device handling (why there is no CUDA, freeing memory between cases).
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from _common import figure

from lab.measure import bootstrap_ratio_ci, median
from lab.result import to_jsonable

from .settings import Settings

# ------------------------------------------------------------------------------------------------ measuring

def sync(device: torch.device) -> None:
    """Wait for the device: CUDA kernels are asynchronous, an unsynchronised clock times the launch only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def block_ms(fn: Callable[[], Any], iters: int, device: torch.device) -> float:
    """Milliseconds per call of ``fn`` over ``iters`` back-to-back calls, synchronised at both ends (one
    sample per block: a sync per call would serialise the GPU and time the launches instead)."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - t0) * 1e3 / iters


def error_text(exc: BaseException) -> str:
    """An exception as one short line (type and the first line of its message), for notes and skip reasons."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def interleaved_ms(arms: dict[str, Callable[[], Any]], *, device: torch.device, repeats: int, iters: int,
                   warmup: int, deadline: float | None = None, min_repeats: int = 3,
                   errors: dict[str, str] | None = None) -> dict[str, list[float]]:
    """Per-block ms samples of each arm, arms interleaved (A B C, A B C, ...) so drift hits all alike.

    Each arm first runs ``warmup`` calls (not timed: cuDNN autotuning, allocator growth, lazy init). An arm
    that raises is dropped and its error text goes to ``errors``; the others go on. After ``min_repeats``
    rounds the loop stops early when ``deadline`` (a ``time.monotonic()`` value) has passed."""
    errors = {} if errors is None else errors
    live = dict(arms)
    for name, fn in list(live.items()):
        try:
            for _ in range(warmup):
                fn()
            sync(device)
        except Exception as exc:  # noqa: BLE001 - an arm that cannot run here is reported, not fatal
            errors[name] = error_text(exc)
            del live[name]
    samples: dict[str, list[float]] = {name: [] for name in live}
    for rep in range(repeats):
        if rep >= min_repeats and deadline is not None and time.monotonic() > deadline:
            break
        for name, fn in list(live.items()):
            try:
                samples[name].append(block_ms(fn, iters, device))
            except Exception as exc:  # noqa: BLE001
                errors[name] = error_text(exc)
                del live[name]
                samples.pop(name)
    return samples


def skipped(name: str, why: str, family: str, unit: str = "x") -> dict[str, Any]:
    """A figure that could not be measured here: NaN with the reason, so a report can say why."""
    return figure(name, float("nan"), unit=unit, note=f"skipped: {why}", family=family)


def ratio_figure(name: str, base: Sequence[float], variant: Sequence[float], *, family: str,
                 goal_min: float | None = None, goal: str | None = None, note: str = "") -> dict[str, Any]:
    """Speedup ``median(base) / median(variant)`` with its bootstrap 95 % CI; ``goal_min`` sets the goal."""
    est, lo, hi = bootstrap_ratio_ci(base, variant)
    if goal_min is not None and goal is None:
        goal = f">= {goal_min:g}x"
    return figure(name, est, unit="x", ci=(lo, hi), goal=goal, met=(est >= goal_min) if goal_min else None,
                  note=note, family=family)


def median_figure(name: str, samples: Sequence[float], *, family: str, unit: str = "ms",
                  note: str = "") -> dict[str, Any]:
    return figure(name, median(samples), unit=unit, note=f"{len(samples)} blocks; {note}".rstrip("; "),
                  family=family)


def max_errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max abs error, that error relative to max |ref|), in fp32."""
    diff = float((out.float() - ref.float()).abs().max())
    scale = float(ref.float().abs().max()) or 1.0
    return diff, diff / scale


# ------------------------------------------------------------------------------------------------ report

@dataclass
class Report:
    """The ``gpu.json`` envelope (the one ``benchmarks/_common.py`` writes), rewritten atomically whenever
    asked, so a run killed by its time limit still leaves every figure measured so far."""

    path: Path | None
    quick: bool
    env: dict[str, Any]
    setting: str
    figures: list[dict[str, Any]] = field(default_factory=list)
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def envelope(self) -> dict[str, Any]:
        return {"benchmark": "gpu", "quick": self.quick, "env": self.env, "figures": self.figures,
                "parts": self.parts, "setting": self.setting}

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(to_jsonable(self.envelope()), indent=2))
        os.replace(tmp, self.path)


@dataclass
class PartContext:
    """What a part gets: the device, the sizes, its deadline, a logger and a checkpoint (write the JSON)."""

    device: torch.device
    sz: Settings
    deadline: float
    log: Callable[[str], None]
    checkpoint: Callable[[], None]

    def left_s(self) -> float:
        return self.deadline - time.monotonic()


# ------------------------------------------------------------------------------------------------ device

def free_memory() -> None:
    """Collect garbage and return cached CUDA memory between cases, so one case's tensors do not crowd the next."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def no_cuda_reason() -> str | None:
    """Why the GPU parts cannot run here, or None when a CUDA device is usable."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"no CUDA device on this machine (torch {torch.__version__} is a CPU-only build)"
    return f"no CUDA device on this machine (torch {torch.__version__}, CUDA {torch.version.cuda}: none visible)"
