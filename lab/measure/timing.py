"""The one timer: per-step phase timing for the loop, interleaved A/B timing for every latency and benchmark.

Why one: a speedup is only a ratio of two numbers measured the same way. Every figure the lab reports
goes through here (docs/architecture.md section 5): a monotonic clock, a device sync before each read on CUDA
(``sync_for``), warm-up calls run but not kept, raw samples returned, and arms interleaved (A B C, A B C, ...)
so that drift on a shared machine hits every arm alike. Taught in ``notebooks/00_tour``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

SyncFn = Callable[[], Any]


def sync_for(device: str | torch.device) -> SyncFn | None:
    """The sync a clock read on ``device`` needs (``None`` on CPU): CUDA kernels are asynchronous, so an
    unsynchronised clock times the launch, not the work."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    return lambda: torch.cuda.synchronize(dev)


def _sync_of(sync: SyncFn | str | torch.device | None) -> SyncFn | None:
    if sync is None or callable(sync):
        return sync
    return sync_for(sync)


def block_ms(fn: Callable[[], Any], iters: int = 1, sync: SyncFn | str | torch.device | None = None) -> float:
    """Milliseconds per call of ``fn`` over ``iters`` back-to-back calls, synchronised at both ends (one
    sample per block: on a GPU a sync per call would serialise it and time the launches instead)."""
    wait = _sync_of(sync)
    if wait:
        wait()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if wait:
        wait()
    return (time.perf_counter() - t0) * 1e3 / iters


def error_text(exc: BaseException) -> str:
    """An exception as one short line (type and the first line of its message), for notes and skip reasons."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def interleaved_ms(arms: dict[str, Callable[[], Any]], *, repeats: int, warmup: int = 2,
                   sync: SyncFn | str | torch.device | None = None, iters: int = 1,
                   deadline: float | None = None, min_repeats: int = 3,
                   errors: dict[str, str] | None = None) -> dict[str, list[float]]:
    """Per-block ms samples of each arm, arms interleaved (A B C, A B C, ...) so drift hits all alike.

    Each arm first runs ``warmup`` calls (not timed: allocator growth, lazy init, cuDNN autotuning). A
    sample is the mean of ``iters`` back-to-back calls (``block_ms``). With ``errors`` given, an arm that
    raises is dropped and its error text goes there while the others go on; without it the error propagates.
    After ``min_repeats`` rounds the loop stops early once ``deadline`` (a ``time.monotonic()`` value) passed.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 0:
        raise ValueError(f"repeats={repeats!r} is invalid: must be an integer >= 0")
    wait = _sync_of(sync)
    live = dict(arms)
    for name, fn in list(live.items()):
        try:
            for _ in range(warmup):
                fn()
            if wait:
                wait()
        except Exception as exc:
            if errors is None:
                raise
            errors[name] = error_text(exc)
            del live[name]
    samples: dict[str, list[float]] = {name: [] for name in live}
    for rep in range(repeats):
        if rep >= min_repeats and deadline is not None and time.monotonic() > deadline:
            break
        for name, fn in list(live.items()):
            try:
                samples[name].append(block_ms(fn, iters, wait))
            except Exception as exc:
                if errors is None:
                    raise
                errors[name] = error_text(exc)
                del live[name]
                samples.pop(name)
    return samples


@torch.no_grad()
def inference_latency_ms(models: dict[str, nn.Module], inputs: tuple[torch.Tensor, ...], *, repeats: int,
                         warmup: int = 2, device: str | torch.device | None = None,
                         iters: int = 1) -> dict[str, list[float]]:
    """Per-call latency samples of every model on the same inputs, in eval mode (each model's mode is
    restored afterwards), models interleaved; ``device`` (default: where the inputs are) decides the sync;
    ``iters`` > 1: a sample is the mean of that many back-to-back calls (a sub-millisecond call timed alone is
    mostly clock and scheduler noise)."""
    device = inputs[0].device if device is None else torch.device(device)
    modes = {name: m.training for name, m in models.items()}
    for m in models.values():
        m.eval()
    try:
        return interleaved_ms({name: (lambda m=m: m(*inputs)) for name, m in models.items()}, repeats=repeats,
                              warmup=warmup, sync=device, iters=iters)
    finally:
        for name, m in models.items():
            m.train(modes[name])


class PhaseTimer:
    """Per-step phase timing with a handful of clock reads per step.

    Why a custom timer: the loop needs *where* each step's time goes (data wait vs compute vs comm), not
    just the total, and it must cost ~nothing so it can stay on for every run. ``mark(phase)`` charges
    the time since the previous mark (or ``start_step``) to ``phase``; marking a phase twice in a step
    accumulates. ``total`` is the wall time ``start_step .. end_step``, so time that nobody marked shows
    up as ``total - sum(phases)`` instead of silently vanishing.

    On CUDA pass ``sync=torch.cuda.synchronize``: kernels are asynchronous, and without a sync before
    each read the time of a phase lands in whichever later phase happens to block.
    """

    def __init__(
        self,
        phases: Sequence[str] = ("data_wait", "forward", "backward", "optimizer", "comm"),
        sync: Callable[[], Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if "total" in phases:
            raise ValueError("'total' is reserved for the step wall time; pick another phase name")
        self.phases: tuple[str, ...] = tuple(phases)
        self._sync = sync
        self._clock = clock
        self._samples: dict[str, list[float]] = {p: [] for p in (*self.phases, "total")}
        self._current: dict[str, float] = {}
        self._t0: float | None = None
        self._last = 0.0

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return self._clock()

    def start_step(self) -> None:
        """Begin a step; everything until ``end_step`` counts towards this step's total."""
        self._t0 = self._last = self._now()
        self._current = dict.fromkeys(self.phases, 0.0)

    def mark(self, phase: str) -> None:
        """Charge the time since the previous mark (or ``start_step``) to ``phase``."""
        if self._t0 is None:
            raise RuntimeError("PhaseTimer.mark() called outside start_step()/end_step()")
        if phase not in self._current:
            raise KeyError(f"unknown phase {phase!r}; known: {self.phases}")
        now = self._now()
        self._current[phase] += now - self._last
        self._last = now

    def end_step(self) -> None:
        """Close the step and append one row (unmarked phases get 0.0)."""
        if self._t0 is None:
            raise RuntimeError("PhaseTimer.end_step() called without start_step()")
        now = self._now()
        for p in self.phases:
            self._samples[p].append(self._current[p] * 1e3)
        self._samples["total"].append((now - self._t0) * 1e3)
        self._t0 = None

    @property
    def n_steps(self) -> int:
        return len(self._samples["total"])

    def samples_ms(self) -> dict[str, list[float]]:
        """Copy of the raw per-step samples in ms, one list per phase plus ``total``."""
        return {k: list(v) for k, v in self._samples.items()}

class EventPhaseTimer(PhaseTimer):
    """:class:`PhaseTimer` on CUDA without a host sync per phase: each mark records a CUDA event on the
    current stream, and the events are read (one ``synchronize`` on the last one) every ``sync_every``
    steps and at :meth:`samples_ms`. The CPU keeps queueing work while the GPU runs, as in real training;
    a per-phase sync would serialise the two and time a loop nobody runs.

    What a phase then measures is the GPU stream time between two marks (data wait = the stream idling
    while the host waited for the batch and its copy), not host time. ``total`` is the step on the stream.
    For a breakdown with exact host-side phases use :class:`PhaseTimer` with ``sync`` (``timing="phase"``),
    which costs one sync per phase (``benchmarks/gpu.sh`` measures the difference)."""

    def __init__(self, phases: Sequence[str] = ("data_wait", "forward", "backward", "optimizer", "comm"),
                 device: str | torch.device = "cuda", sync_every: int = 1) -> None:
        super().__init__(phases=phases)
        if sync_every < 1:
            raise ValueError(f"sync_every={sync_every} is invalid: allowed: an int >= 1")
        self.device = torch.device(device)
        self.sync_every = sync_every
        self._marks: list[tuple[str | None, Any]] = []
        self._pending: list[list[tuple[str | None, Any]]] = []

    def _event(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def start_step(self) -> None:
        self._t0 = 0.0  # a step is open (the base class checks it)
        self._marks = [(None, self._event())]

    def mark(self, phase: str) -> None:
        if self._t0 is None:
            raise RuntimeError("PhaseTimer.mark() called outside start_step()/end_step()")
        if phase not in self.phases:
            raise KeyError(f"unknown phase {phase!r}; known: {self.phases}")
        self._marks.append((phase, self._event()))

    def end_step(self) -> None:
        if self._t0 is None:
            raise RuntimeError("PhaseTimer.end_step() called without start_step()")
        self._marks.append((None, self._event()))
        self._pending.append(self._marks)
        self._t0 = None
        if len(self._pending) >= self.sync_every:
            self._resolve()

    def _resolve(self) -> None:
        if not self._pending:
            return
        self._pending[-1][-1][1].synchronize()  # one host sync for the whole batch of steps
        for marks in self._pending:
            row = dict.fromkeys(self.phases, 0.0)
            for (_, prev), (phase, ev) in zip(marks, marks[1:], strict=False):
                if phase is not None:
                    row[phase] += prev.elapsed_time(ev)
            for p in self.phases:
                self._samples[p].append(row[p])
            self._samples["total"].append(marks[0][1].elapsed_time(marks[-1][1]))
        self._pending = []

    @property
    def n_steps(self) -> int:
        return len(self._samples["total"]) + len(self._pending)

    def samples_ms(self) -> dict[str, list[float]]:
        self._resolve()
        return super().samples_ms()


def step_timer(device: str | torch.device, phases: Sequence[str], timing: str = "step") -> PhaseTimer:
    """The loop's timer: on CPU the plain clock (no sync exists); on CUDA CUDA events read once per step
    (``timing="step"``, the default) or a device sync before every phase read (``timing="phase"``, an
    exact host-side breakdown that removes the CPU/GPU overlap)."""
    if timing not in ("step", "phase"):
        raise ValueError(f"timing={timing!r} is invalid: allowed: step, phase")
    dev = torch.device(device)
    if dev.type == "cuda" and timing == "step":
        return EventPhaseTimer(phases=phases, device=dev)
    return PhaseTimer(phases=phases, sync=sync_for(dev))


__all__ = [
    "block_ms", "error_text", "EventPhaseTimer", "inference_latency_ms", "interleaved_ms", "PhaseTimer",
    "step_timer", "sync_for",
]
