"""The instrumented step loop: every technique in the lab is trained and timed through :func:`fit`.

Why one loop: a speedup is only meaningful when both arms ran the same code with the same measurement.
Per step it records how long it waited for data and spent in forward, backward, optimizer and (data-
parallel) communication, keeps the raw samples, and leaves summaries to :class:`lab.result.RunResult`
(which drops the warm-up steps). What a technique changes in a step comes in as an argument, never as an
import: a *step policy* (mixed precision, :mod:`lab.precision`) owns autocast, backward and the optimizer
step; a *ddp runtime* (:mod:`lab.distributed`) owns ``no_sync`` and the comm timing; ``forward`` replaces
``model(...)`` (``torch.compile``, :mod:`lab.compute`). With none of them this is exactly
``loss = loss_fn(model(x), y); loss.backward(); optimizer.step()``.
Taught in ``notebooks/00_tour.ipynb``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from lab.measure import MemorySampler, step_timer
from lab.workloads import Workload

PHASES = ("data_wait", "forward", "backward", "optimizer", "comm")
#: How often (in steps) the loop samples process memory: each sample reads /proc, so not every step.
MEMORY_SAMPLE_EVERY = 10
#: On CUDA the loop reads the loss every this many steps (each read is a host sync that stalls the queue);
#: on CPU every step (a read costs nothing there). The non-finite check runs at every read.
LOSS_READ_EVERY = 10

#: Set on Ctrl-C by the command line's SIGINT handler (:func:`lab.cli.catch_interrupts`). Python can swallow the
#: KeyboardInterrupt itself: a Ctrl-C that lands while a DataLoader forks its workers is raised inside the fork's
#: at-fork handler, printed as "Exception ignored" and dropped, and the work went on to exit 0. The step loop and
#: the ablation runner check the flag at each step and each run (:func:`raise_if_interrupted`).
INTERRUPTED = threading.Event()


def raise_if_interrupted() -> None:
    """``KeyboardInterrupt`` if a Ctrl-C arrived whose own exception was swallowed."""
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt


ProgressFn = Callable[[dict[str, Any]], None]
#: ``hook(step, model)`` after each optimizer step, outside the timed phases (a gradual pruning schedule).
StepHook = Callable[[int, nn.Module], None]
#: ``evaluate() -> metric`` on the held-out split, every ``eval_every`` steps, timed apart from training.
EvalFn = Callable[[], float]


class Loader(Protocol):
    """What the loop needs of a loader: batches, a length in batches, and a per-epoch reshuffle."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]: ...
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...


class StepPolicy(Protocol):
    """The three places precision touches a step (:class:`lab.precision.PrecisionPolicy` is one)."""

    def applied(self, model: nn.Module) -> contextlib.AbstractContextManager: ...
    def autocast(self) -> contextlib.AbstractContextManager: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def step(self, optimizer: torch.optim.Optimizer) -> None: ...


class PlainStep:
    """The fp32 step: no autocast, ``loss.backward()``, ``optimizer.step()``."""

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        yield model

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()


PLAIN = PlainStep()


class DDPStep(Protocol):
    """What data-parallel training needs of the loop (:class:`lab.distributed.DDPRuntime` is one)."""

    grad_accum_steps: int
    recorder: Any  # has end_step() -> comm ms of the step, or None

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager: ...


class Checkpointer(Protocol):
    """Checkpoint and resume (:class:`lab.data.checkpoint.Checkpointer` is one): ``restore`` once before the
    first step returns (steps already done, their losses); ``save`` after every step decides itself whether
    to write. The loop turns the step into (epoch, batches done in it) and skips those on resume."""

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                policy: StepPolicy) -> tuple[int, list[float]]: ...
    def due(self, step: int) -> bool: ...
    def save(self, *, step: int, epoch: int, batches_done: int, model: nn.Module,
             optimizer: torch.optim.Optimizer, policy: StepPolicy, losses: list[float]) -> object: ...


def skip_batches(loader: Loader, batches: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """The epoch's batches from ``batches`` on: ``loader.skip`` when the loader can start mid-epoch without
    reading (every lab loader), else the first ``batches`` are read and dropped."""
    skip = getattr(loader, "skip", None)
    if skip is not None:
        skip(batches)
        return iter(loader)
    it = iter(loader)
    for _ in range(batches):
        next(it, None)
    return it


@dataclass
class FitStats:
    """Raw samples from one :func:`fit` call."""

    steps: int
    time_s: float
    losses: list[float]
    step_times_ms: dict[str, list[float]]
    peak_memory_mb: float
    memory_kind: str
    #: One point per evaluation during training, ``{"step", "train_s", "metric", "eval_s"}``, where
    #: ``train_s`` is the training time so far with evaluations and checkpoint writes taken out.
    evals: list[dict[str, float]] = field(default_factory=list)
    eval_s: float = 0.0  # time spent in those evaluations (not in ``time_s``, not in any step)
    checkpoint_s: float = 0.0  # time spent writing checkpoints (a one-off cost: not in ``time_s``)


def to_device(batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """The batch on ``device`` (a no-op on CPU; non-blocking from pinned memory on CUDA)."""
    if device.type == "cpu":
        return batch
    return tuple(t.to(device, non_blocking=True) for t in batch)


def make_optimizer(name: str, params: Iterable[nn.Parameter], lr: float, *,
                   fused: bool = False) -> torch.optim.Optimizer:
    """Adam or SGD with momentum. ``fused`` (``compute.fused_optimizer``) updates every parameter in one
    fused kernel per dtype and device instead of torch's default multi-tensor ("foreach") loop; ``False``
    leaves the choice to torch."""
    kwargs = {"fused": True} if fused else {}
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, **kwargs)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, **kwargs)


def _unmarked(phase: str) -> None:
    """No phase timer: a step timed as a whole (the crossover map's arms)."""


def split_rows(batch: tuple[torch.Tensor, ...], parts: int) -> list[tuple[torch.Tensor, ...]]:
    """``batch`` cut along its first dimension (rows) into ``parts`` micro-batches as even as they go (views, no
    copy); fewer when the batch has fewer rows than ``parts`` (no empty micro-batch)."""
    if parts <= 1:
        return [batch]
    pieces = [torch.tensor_split(t, parts) for t in batch]
    return [tuple(p[i] for p in pieces) for i in range(parts) if len(pieces[-1][i])]


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable[..., torch.Tensor],
               batches: Iterator[tuple[torch.Tensor, ...]], device: torch.device, *,
               policy: StepPolicy | None = None, forward: Callable[..., torch.Tensor] | None = None,
               ddp: DDPStep | None = None, accum: int = 1, micro_batches: int = 1,
               mark: Callable[[str], None] = _unmarked, comm_ms: list[float] | None = None) -> torch.Tensor | None:
    """One optimizer step: ``accum`` batches from ``batches`` (each moved to ``device``), forward + loss in
    the policy's autocast, the policy's backward (all but the last under DDP's ``no_sync``), the policy's
    optimizer step, gradients cleared. Returns the step's loss (the mean over its batches), or ``None`` when
    ``batches`` ran out inside the accumulation (the partial step is dropped, gradients cleared).

    ``micro_batches`` > 1 (the memory family's accumulation, ``memory.micro_batches``) cuts each batch into that
    many micro-batches of its rows, each run forward and backward on its own, its loss weighted by its share of
    the batch's rows: the gradient is the whole batch's (for a loss that is a mean over rows, up to float
    rounding; a layer that reads the batch, BatchNorm, sees the micro-batch) while the activations alive at
    once are one micro-batch's. ``accum`` > 1 (``ddp.grad_accum_steps``) adds batches instead: a larger step.

    The one step of the lab: :func:`fit` runs it with its phase timer's ``mark`` (data wait, forward, backward,
    optimizer) and DDP's comm figures (``comm_ms``); the crossover map times it whole on a fixed batch
    (:func:`lab.timed.timed_train`), so a map ratio is a ratio of the step a run takes."""
    policy = PLAIN if policy is None else policy
    forward = model if forward is None else forward
    micro_losses = []
    for micro in range(accum):
        batch = next(batches, None)
        if batch is None:
            break
        batch = to_device(batch, device)
        mark("data_wait")
        parts = split_rows(batch, micro_batches)
        rows = len(batch[-1])
        part_losses = []
        for i, part in enumerate(parts):
            last = micro == accum - 1 and i == len(parts) - 1
            sync_ctx = ddp.no_sync(model) if ddp is not None and not last else contextlib.nullcontext()
            with sync_ctx:
                with policy.autocast():  # forward + loss only; backward and step outside (seed-004 bug)
                    out = forward(*part[:-1])
                    loss = loss_fn(out, part[-1])
                mark("forward")
                if len(parts) > 1:
                    policy.backward(loss * (len(part[-1]) / rows / accum))
                else:
                    policy.backward(loss / accum if accum > 1 else loss)
                mark("backward")
            part_losses.append(loss if len(parts) == 1 else loss.detach() * (len(part[-1]) / rows))
        micro_losses.append(part_losses[0] if len(parts) == 1 else torch.stack(part_losses).sum())
    if len(micro_losses) < accum:
        optimizer.zero_grad(set_to_none=True)
        return None
    loss = micro_losses[0] if accum == 1 else torch.stack([m.detach() for m in micro_losses]).mean()
    if ddp is not None and ddp.recorder is not None and comm_ms is not None:
        comm_ms.append(ddp.recorder.end_step())
    policy.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    mark("optimizer")
    return loss


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, loader: Loader, wl: Workload, device: torch.device, *,
        epochs: int, max_steps: int | None = None, step_hooks: Sequence[StepHook] = (),
        progress: ProgressFn | None = None, phase: str = "train", policy: StepPolicy | None = None,
        ddp: DDPStep | None = None, forward: Callable[..., torch.Tensor] | None = None,
        checkpoint: Checkpointer | None = None, evaluate: EvalFn | None = None,
        eval_every: int | None = None, micro_batches: int = 1) -> FitStats:
    """The instrumented loop. Per step: data wait (incl. the copy to the device) | forward + loss |
    backward | optimizer | comm (DDP). ``step_hooks(step, model)`` run after each optimizer step, outside
    the timed phases. A non-finite loss stops training with an error naming the step: a diverged run must
    never be reported as a result. ``policy`` wraps forward + loss in autocast and owns backward and the
    optimizer step (default: :data:`PLAIN`). ``ddp``: a step is ``grad_accum_steps`` micro-batches, all but
    the last under ``no_sync``; the "comm" phase is the time DDP's all-reduces were in flight (it overlaps
    backward, so it is moved out of the backward figure: backward = backward wall time - comm, clipped at
    0). ``forward`` (e.g. ``torch.compile(model)``) replaces ``model(...)`` in the step; hooks, the policy
    and DDP still see ``model``. ``checkpoint`` restores a resumed run's state and position before the first
    step and is offered every step to save one. ``evaluate`` runs every ``eval_every`` steps and after the
    last one, outside the timed phases; its time and the checkpoint writes' are recorded apart (``eval_s``,
    ``checkpoint_s``) and left out of ``time_s``. ``micro_batches``: each batch runs as that many micro-batches,
    gradients accumulated (:func:`train_step`: the same step, fewer activations alive at once)."""
    policy = PLAIN if policy is None else policy
    forward = model if forward is None else forward
    accum = ddp.grad_accum_steps if ddp is not None else 1
    steps_per_epoch = len(loader) // accum
    total_steps = epochs * steps_per_epoch
    if max_steps is not None:
        total_steps = min(total_steps, max_steps)
    # LAB_TIMING=phase: a device sync before every phase read (an exact breakdown; removes CPU/GPU overlap)
    timer = step_timer(device, PHASES, os.environ.get("LAB_TIMING", "step"))
    read_every = LOSS_READ_EVERY if device.type == "cuda" else 1
    unread: list[torch.Tensor] = []
    memory = MemorySampler(device)
    losses: list[float] = []
    comm_ms: list[float] = []
    evals: list[dict[str, float]] = []
    apart = {"eval": 0.0, "checkpoint": 0.0}  # seconds outside training inside the loop's wall time
    step = 0
    if checkpoint is not None:  # a resumed run starts at its saved step, mid-epoch
        step, losses = checkpoint.restore(model, optimizer, policy)
    first_epoch = step // max(steps_per_epoch, 1)
    model.train()
    t_start = time.perf_counter()
    with policy.applied(model):
        for epoch in range(first_epoch, epochs):
            if step >= total_steps:
                break
            loader.set_epoch(epoch)
            done_in_epoch = (step - epoch * steps_per_epoch) * accum
            batches = skip_batches(loader, done_in_epoch) if done_in_epoch else iter(loader)
            while step < total_steps:
                raise_if_interrupted()
                timer.start_step()
                loss = train_step(model, optimizer, wl.loss, batches, device, policy=policy, forward=forward,
                                  ddp=ddp, accum=accum, micro_batches=micro_batches, mark=timer.mark,
                                  comm_ms=comm_ms)
                if loss is None:  # epoch ended inside an accumulation: the partial step was dropped
                    break
                timer.end_step()
                unread.append(loss.detach())
                if len(unread) >= read_every or step + 1 >= total_steps:
                    _read_losses(unread, losses, step, epoch, phase)
                value = losses[-1] if losses else None  # on CUDA: as of the last read
                for hook in step_hooks:
                    hook(step, model)
                if step % MEMORY_SAMPLE_EVERY == 0:
                    memory.sample()
                step += 1
                if checkpoint is not None and checkpoint.due(step):
                    t_ck = time.perf_counter()
                    _read_losses(unread, losses, step - 1, epoch, phase)  # the saved losses are complete (CUDA)
                    checkpoint.save(step=step, epoch=epoch, batches_done=(step - epoch * steps_per_epoch) * accum,
                                    model=model, optimizer=optimizer, policy=policy, losses=losses)
                    apart["checkpoint"] += time.perf_counter() - t_ck
                if evaluate is not None and eval_every and (step % eval_every == 0 or step >= total_steps):
                    evals.append(_timed_eval(evaluate, step, t_start, apart, device))
                if progress:
                    progress({"phase": phase, "step": step, "total_steps": total_steps, "epoch": epoch,
                              "epochs": epochs, "loss": value})
    if unread:  # the steps since the last read
        _read_losses(unread, losses, step - 1, epoch, phase)
    if evaluate is not None and eval_every and step and (not evals or evals[-1]["step"] != step):
        evals.append(_timed_eval(evaluate, step, t_start, apart, device))  # the curve ends where training did
    elapsed = time.perf_counter() - t_start - apart["eval"] - apart["checkpoint"]
    memory.sample()
    samples = timer.samples_ms()
    if comm_ms and len(comm_ms) == len(samples["comm"]):
        samples["backward"] = [max(b - c, 0.0) for b, c in zip(samples["backward"], comm_ms, strict=True)]
        samples["comm"] = comm_ms
    return FitStats(steps=step, time_s=elapsed, losses=losses, step_times_ms=samples,
                    peak_memory_mb=memory.peak_mb(), memory_kind=memory.kind, evals=evals, eval_s=apart["eval"],
                    checkpoint_s=apart["checkpoint"])


def _timed_eval(evaluate: EvalFn, step: int, t_start: float, apart: dict[str, float],
                device: torch.device) -> dict[str, float]:
    """One evaluation point: the training time so far (the device's queue drained first, evaluations and
    checkpoint writes taken out), then the metric, its own time added to ``apart["eval"]``."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    train_s = t0 - t_start - apart["eval"] - apart["checkpoint"]
    metric = float(evaluate())
    took = time.perf_counter() - t0
    apart["eval"] += took
    return {"step": step, "train_s": train_s, "metric": metric, "eval_s": took}


def _read_losses(unread: list[torch.Tensor], losses: list[float], last_step: int, epoch: int, phase: str) -> None:
    """Read the losses of the steps since the last read (one host sync) into ``losses``; a non-finite one
    stops training with an error naming its step (and, on CUDA, the steps read together)."""
    if not unread:
        return
    values = [unread[0].item()] if len(unread) == 1 else torch.stack(unread).float().cpu().tolist()
    first = last_step - len(values) + 1
    unread.clear()
    for i, value in enumerate(values):
        if not np.isfinite(value):
            read = "" if len(values) == 1 else f", read with steps {first}-{last_step}"
            raise FloatingPointError(f"loss became {value} at step {first + i} (epoch {epoch}, {phase}{read}); "
                                     "lower the lr or check the data")
        losses.append(value)
