"""The one training loop: every technique in the lab is measured through :func:`run`.

Why one loop: a speedup is only meaningful when both arms ran the same code with the same measurement.
Loop options (data loading, precision, DDP) plug in as small helpers that are no-ops when off; model
transforms (pruning, quantization) take a model and return a model. Per step the loop records how long
it waited for data and spent in forward, backward, optimizer and (for DDP) communication, keeps the raw
samples, and leaves summaries to :class:`lab.result.RunResult` (which drops the warm-up steps).

Run it: ``python -m lab run --workload ctr --size small`` (notebooks/00_tour.ipynb walks through it).
"""

from __future__ import annotations

import contextlib
import random
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import torch
from torch import nn

from lab import distributed, measure, precision, transforms
from lab.config import RunConfig
from lab.data import make_loader
from lab.result import RunResult
from lab.workloads import Datasets, SizeSpec, Workload, get_workload, list_workloads

PHASES = ("data_wait", "forward", "backward", "optimizer", "comm")
#: How often (in steps) the loop samples process memory: each sample reads /proc, so not every step.
MEMORY_SAMPLE_EVERY = 10

ProgressFn = Callable[[dict[str, Any]], None]


class NotImplementedYet(NotImplementedError):
    """A technique family was switched on whose issue has not landed: refuse rather than run the baseline."""


# Families implemented by this loop. The other issues extend this as they land.
_IMPLEMENTED_LOADERS = ("memory", "dataloader", "naive", "thread", "device_prefetch")


def check_implemented(cfg: RunConfig) -> None:
    """Raise :class:`NotImplementedYet` if ``cfg`` switches on something the lab cannot do yet."""
    missing = []
    if cfg.data.loader not in _IMPLEMENTED_LOADERS:
        missing.append(f"data.loader={cfg.data.loader!r} (data-loading lab)")
    if cfg.quant.enabled:  # landed; refuse combinations int8 cannot run (CUDA, fp16 autocast) before training
        from lab import quantization

        quantization.check_supported(cfg)
    if cfg.ddp.enabled:  # landed; refuse a backend this machine cannot run before spawning ranks
        distributed.resolve_backend(cfg.ddp.backend, resolve_device(cfg.device))
    if cfg.compute.fast_kernels and get_workload(cfg.workload).fast_kernels is None:
        raise ValueError(f"compute.fast_kernels=True is invalid for workload {cfg.workload!r}: it has no faster "
                         "implementation (workloads with one: "
                         + ", ".join(n for n in list_workloads() if get_workload(n).fast_kernels) + ")")
    if cfg.compute.compile and cfg.ddp.enabled:
        raise ValueError("compute.compile=True is invalid with ddp: compiling the DDP-wrapped model is not wired "
                         "up in this lab yet; compare compile on a single process")
    if missing:
        raise NotImplementedYet("not implemented yet: " + "; ".join(missing))


@dataclass(frozen=True)
class Resolved:
    """The config with the workload's size defaults filled in: what actually ran."""

    workload: Workload
    spec: SizeSpec
    device: torch.device
    epochs: int
    batch_size: int
    lr: float


def resolve(cfg: RunConfig) -> Resolved:
    """Fill ``None`` fields from the workload's size spec and pick the device."""
    wl = get_workload(cfg.workload)
    spec = wl.sizes[cfg.size]
    return Resolved(workload=wl, spec=spec, device=resolve_device(cfg.device),
                    epochs=cfg.epochs or spec.epochs, batch_size=cfg.batch_size or spec.batch_size,
                    lr=cfg.lr or spec.lr)


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when present, else CPU; asking for CUDA without it is an error, not a fallback."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} is invalid: CUDA is not available on this machine (use cpu or auto)")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed every generator a run touches, so the same config gives the same loss curve on CPU."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextlib.contextmanager
def thread_count(threads: int | None) -> Iterator[int]:
    """Set torch's intra-op threads for the run and restore them after: a library call should not leave
    the process's thread count changed behind the caller's back."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def _to_device(batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    if device.type == "cpu":
        return batch
    return tuple(t.to(device, non_blocking=True) for t in batch)


def _sync_fn(device: torch.device) -> Callable[[], None] | None:
    # Without a sync, CUDA timings measure kernel launches, not the work.
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


@torch.no_grad()
def evaluate(model: nn.Module, wl: Workload, tensors: tuple[torch.Tensor, ...], device: torch.device,
             batch_size: int) -> dict[str, float]:
    """The workload's metrics on a held-out split, in eval mode (restoring the previous mode)."""
    was_training = model.training
    model.eval()
    try:
        outs = []
        n = len(tensors[0])
        for i in range(0, n, batch_size):
            batch = _to_device(tuple(t[i:i + batch_size] for t in tensors[:-1]), device)
            outs.append(model(*batch).float().cpu())
        return {k: float(v) for k, v in wl.evaluate(torch.cat(outs), tensors[-1]).items()}
    finally:
        model.train(was_training)


@torch.no_grad()
def inference_latency_ms(model: nn.Module, inputs: tuple[torch.Tensor, ...], device: torch.device,
                         repeats: int, warmup: int = 3) -> list[float]:
    """Per-call latency samples of ``model(*inputs)`` in eval mode; warm-up calls are not kept."""
    was_training = model.training
    model.eval()
    sync = _sync_fn(device)
    inputs = _to_device(inputs, device)
    samples = []
    try:
        for i in range(warmup + repeats):
            if sync:
                sync()
            t0 = time.perf_counter()
            model(*inputs)
            if sync:
                sync()
            if i >= warmup:
                samples.append((time.perf_counter() - t0) * 1e3)
    finally:
        model.train(was_training)
    return samples


def make_optimizer(name: str, params, lr: float, *, fused: bool = False) -> torch.optim.Optimizer:
    """Adam or SGD with momentum. ``fused`` (``compute.fused_optimizer``) updates every parameter in one
    fused kernel per dtype and device instead of torch's default multi-tensor ("foreach") loop; ``False``
    leaves the choice to torch."""
    kwargs = {"fused": True} if fused else {}
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, **kwargs)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, **kwargs)


def run(cfg: RunConfig, *, progress: ProgressFn | None = None, on_error: str = "raise") -> RunResult:
    """Train ``cfg``'s workload once and measure it.

    ``progress`` receives a small dict per step (``phase``, ``step``, ``total_steps``, ``epoch``, ``loss``)
    and once per evaluation. ``on_error="record"`` turns a failure during the run into a RunResult with
    ``status="error"`` (what an ablation stores as an error row); ``"raise"`` re-raises. Configuration
    problems (bad values, families not implemented yet) always raise before any work starts.
    """
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error={on_error!r} is invalid: allowed: raise, record")
    check_implemented(cfg)
    if cfg.ddp.world_size > 1 and not distributed.detect_launch().distributed:
        return distributed.spawn_run(cfg)  # one process per rank, each comes back here under the launcher
    r = resolve(cfg)
    result = RunResult(run_id=uuid.uuid4().hex, config=cfg.to_dict(), env={}, workload=cfg.workload,
                       started_at=datetime.now(UTC).isoformat(timespec="seconds"),
                       metric_name=r.workload.metric_name, higher_is_better=r.workload.higher_is_better,
                       batch_size=r.batch_size, warmup_steps=cfg.warmup_steps)
    with thread_count(cfg.threads):
        result.env = measure.environment_stamp(str(r.device))
        try:
            _train_and_measure(cfg, r, result, progress)
        except Exception as exc:
            if on_error == "raise":
                raise
            result.status = "error"
            result.error = f"{type(exc).__name__}: {exc}"
            result.details["traceback"] = traceback.format_exc(limit=8)
    return result


@dataclass
class TrainContext:
    """What a technique module gets to work with: the run's config, data, device and result record, and
    :meth:`fit` / :meth:`evaluate`, so that fine-tuning after pruning or QAT reuses the same measured loop
    instead of writing a second one. Technique modules record their figures in ``result.details`` and
    their "why" tags in ``result.why``."""

    cfg: RunConfig
    resolved: Resolved
    data: Datasets
    result: RunResult
    progress: ProgressFn | None = None
    ddp: distributed.DDPRuntime | None = None  # set by run() when data-parallel; None = single process
    _precision_dtype: str | None = None  # cfg.precision.dtype with "auto" resolved (once, on first fit)

    @property
    def device(self) -> torch.device:
        return self.resolved.device

    @property
    def workload(self) -> Workload:
        return self.resolved.workload

    def make_loader(self, batch_size: int | None = None):
        """A loader over the training split as the config asks (same batch order for the same seed).
        Data-parallel: every rank walks the same global batches (batch x world size) and keeps its slice."""
        batch_size = batch_size or self.resolved.batch_size
        if self.ddp is not None and self.ddp.info.distributed:
            world = self.ddp.info.world_size
            loader = make_loader(self.data.train, self.cfg.data, batch_size * world, seed=self.cfg.seed,
                                 device=self.device)
            return distributed.RankSlicedLoader(loader, self.ddp.info.rank, world)
        return make_loader(self.data.train, self.cfg.data, batch_size, seed=self.cfg.seed, device=self.device)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return evaluate(model, self.workload, self.data.test, self.device, self.cfg.eval_batch_size)

    def fit(self, model: nn.Module, *, epochs: int, lr: float, max_steps: int | None = None,
            step_hooks: Sequence[StepHook] = (), phase: str = "train") -> FitStats:
        """Train ``model`` in place with the run's optimizer, loader and loop options; returns the raw
        per-step samples. The main training phase and any fine-tuning both go through here."""
        optimizer = make_optimizer(self.cfg.optimizer, [p for p in model.parameters() if p.requires_grad], lr,
                                   fused=self.cfg.compute.fused_optimizer)
        policy = precision.policy_for(self, model, lr) if self.cfg.precision.enabled else None
        # compute.compile: only the main training phase runs compiled; fine-tunes after pruning or QAT change
        # the module structure and run eagerly. Compilation happens in the first step, inside the timing.
        forward = torch.compile(model) if self.cfg.compute.compile and phase == "train" else None
        stats = fit(model, optimizer, self.make_loader(), self.workload, self.device, epochs=epochs,
                    max_steps=max_steps, step_hooks=step_hooks, progress=self.progress, phase=phase,
                    policy=policy, ddp=self.ddp, forward=forward)
        if policy is not None:
            self.result.details.setdefault("precision", {}).setdefault("phases", {})[phase] = policy.diagnostics()
        return stats


StepHook = Callable[[int, nn.Module], None]


@dataclass
class FitStats:
    """Raw samples from one :func:`fit` call."""

    steps: int
    time_s: float
    losses: list[float]
    step_times_ms: dict[str, list[float]]
    peak_memory_mb: float
    memory_kind: str


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, loader, wl: Workload, device: torch.device, *,
        epochs: int, max_steps: int | None = None, step_hooks: Sequence[StepHook] = (),
        progress: ProgressFn | None = None, phase: str = "train",
        policy: precision.PrecisionPolicy | None = None, ddp: distributed.DDPRuntime | None = None,
        forward: Callable[..., torch.Tensor] | None = None) -> FitStats:
    """The instrumented loop. Per step: data wait (incl. the copy to the device) | forward + loss |
    backward | optimizer | comm (DDP). ``step_hooks(step, model)`` run after each optimizer step, outside
    the timed phases (a gradual pruning schedule uses this). A non-finite loss stops training with an
    error naming the step: a diverged run must never be reported as a result. ``policy`` (mixed precision,
    :mod:`lab.precision`) wraps forward + loss in autocast and owns backward and the optimizer step; the
    default is the no-op fp32 policy, which runs exactly ``loss.backward(); optimizer.step()``.
    ``ddp`` (:mod:`lab.distributed`): a step is ``grad_accum_steps`` micro-batches, all but the last under
    ``no_sync``; the "comm" phase is the time DDP's all-reduces were in flight (it overlaps backward, so it
    is moved out of the backward figure: backward = backward wall time - comm, clipped at 0).
    ``forward`` (e.g. ``torch.compile(model)``) replaces ``model(...)`` in the step; hooks, the precision
    policy and DDP still see ``model``."""
    policy = policy or precision.FP32
    forward = model if forward is None else forward
    accum = ddp.grad_accum_steps if ddp is not None else 1
    steps_per_epoch = len(loader) // accum
    total_steps = epochs * steps_per_epoch
    if max_steps is not None:
        total_steps = min(total_steps, max_steps)
    timer = measure.PhaseTimer(phases=PHASES, sync=_sync_fn(device))
    memory = measure.MemoryTracker(device)
    losses: list[float] = []
    comm_ms: list[float] = []
    step = 0
    model.train()
    t_start = time.perf_counter()
    with policy.applied(model):
        for epoch in range(epochs):
            if step >= total_steps:
                break
            loader.set_epoch(epoch)
            batches = iter(loader)
            while step < total_steps:
                timer.start_step()
                micro_losses = []
                for micro in range(accum):
                    batch = next(batches, None)
                    if batch is None:
                        break
                    batch = _to_device(batch, device)
                    timer.mark("data_wait")
                    sync_ctx = ddp.no_sync(model) if ddp is not None and micro < accum - 1 else contextlib.nullcontext()
                    with sync_ctx:
                        with policy.autocast():  # forward + loss only; backward and step outside (seed-004 bug)
                            out = forward(*batch[:-1])
                            loss = wl.loss(out, batch[-1])
                        timer.mark("forward")
                        policy.backward(loss / accum if accum > 1 else loss)
                        timer.mark("backward")
                    micro_losses.append(loss)
                if len(micro_losses) < accum:  # epoch ended inside an accumulation: drop the partial step
                    optimizer.zero_grad(set_to_none=True)
                    break
                if accum > 1:
                    loss = torch.stack([m.detach() for m in micro_losses]).mean()
                if ddp is not None and ddp.recorder is not None:
                    comm_ms.append(ddp.recorder.end_step())
                policy.step(optimizer)
                optimizer.zero_grad(set_to_none=True)
                timer.mark("optimizer")
                timer.end_step()
                value = loss.item()
                if not np.isfinite(value):
                    raise FloatingPointError(f"loss became {value} at step {step} (epoch {epoch}, {phase}); "
                                             "lower the lr or check the data")
                losses.append(value)
                for hook in step_hooks:
                    hook(step, model)
                if step % MEMORY_SAMPLE_EVERY == 0:
                    memory.sample()
                step += 1
                if progress:
                    progress({"phase": phase, "step": step, "total_steps": total_steps, "epoch": epoch,
                              "epochs": epochs, "loss": value})
    elapsed = time.perf_counter() - t_start
    memory.sample()
    samples = timer.samples_ms()
    if comm_ms and len(comm_ms) == len(samples["comm"]):
        samples["backward"] = [max(b - c, 0.0) for b, c in zip(samples["backward"], comm_ms, strict=True)]
        samples["comm"] = comm_ms
    return FitStats(steps=step, time_s=elapsed, losses=losses, step_times_ms=samples,
                    peak_memory_mb=memory.peak_mb(), memory_kind=memory.kind)


def _train_and_measure(cfg: RunConfig, r: Resolved, result: RunResult, progress: ProgressFn | None) -> None:
    wl, device = r.workload, r.device
    data: Datasets = wl.make_data(r.spec, cfg.data_seed)
    ctx = TrainContext(cfg=cfg, resolved=r, data=data, result=result, progress=progress)
    ctx.ddp, created_group = distributed.setup_for_run(cfg, device)
    main_rank = ctx.ddp is None or ctx.ddp.info.rank == 0  # only rank 0 evaluates and reports
    seed_everything(cfg.seed)
    model = wl.make_model(r.spec).to(device)
    if cfg.compute.fast_kernels:
        model = wl.fast_kernels(model)
    steps_per_epoch = len(ctx.make_loader())
    result.details.update({
        "resolved": {"epochs": r.epochs, "batch_size": r.batch_size, "lr": r.lr, "device": str(device),
                     "steps_per_epoch": steps_per_epoch, "n_train": len(data.train[0]),
                     "n_test": len(data.test[0])},
        "data_info": data.info,
        "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(),
                    "loader_workers": cfg.data.num_workers},
    })

    if main_rank:
        before = ctx.evaluate(model)
        result.metric_before = before[wl.metric_name]
        if progress:
            progress({"phase": "eval_before", "metrics": before})

    model, hooks = transforms.before_training(ctx, model)
    if ctx.ddp is not None:
        model = distributed.wrap(model, ctx.ddp, cfg.ddp, device)
    stats = ctx.fit(model, epochs=r.epochs, lr=r.lr, max_steps=cfg.max_steps, step_hooks=hooks)
    if ctx.ddp is not None:
        model = distributed.unwrap(model)
        result.details["ddp"] = distributed.describe(ctx.ddp, cfg, r.batch_size, r.lr)
        if created_group:
            distributed.finish()
        if not main_rank:
            return
    result.train_time_s = stats.time_s
    result.steps = stats.steps
    result.losses = stats.losses
    result.step_times_ms = stats.step_times_ms
    result.peak_memory_mb, result.memory_kind = stats.peak_memory_mb, stats.memory_kind
    model = transforms.after_training(ctx, model)

    after = ctx.evaluate(model)
    result.metrics = after
    result.metric = after[wl.metric_name]
    if progress:
        progress({"phase": "eval", "metrics": after})

    _measure_model(cfg, model, data, device, result)
    if progress:
        progress({"phase": "done"})


def _measure_model(cfg: RunConfig, model: nn.Module, data: Datasets, device: torch.device,
                   result: RunResult) -> None:
    """Static facts about the trained model plus its inference latency at batch 1 and batch N."""
    one = tuple(t[:1] for t in data.test[:-1])
    result.param_count = measure.count_params(model)
    result.nonzero_params = measure.count_nonzero_params(model)
    result.model_bytes = measure.serialized_size_bytes(model)
    result.macs_per_sample = measure.count_macs(model, _to_device(one, device))
    if cfg.latency_repeats:
        n = min(cfg.eval_batch_size, len(data.test[0]))
        many = tuple(t[:n] for t in data.test[:-1])
        result.latency_ms = {
            "batch_1": inference_latency_ms(model, one, device, cfg.latency_repeats),
            f"batch_{n}": inference_latency_ms(model, many, device, max(3, cfg.latency_repeats // 4)),
        }
