"""What a run, a technique or a study needs, built once: :func:`prepare` and :class:`TrainContext`.

Why one place: a study that trains a model (pruning sensitivity, the float baseline of quantization, the
ideal-loader replay, the skew cost, the precision probe) must train it exactly as :func:`lab.run` would,
or its figures describe a different training step. So every one of them calls :func:`prepare` and
``ctx.fit``, and ``ctx.fit`` assembles the step from the config through the run's techniques.

Techniques: the run's :class:`lab.technique.TechniqueChain` (``ctx.techniques``, passed to :func:`prepare`,
by default :func:`lab.technique.default_chain`) builds every fit's loader and contributes to every fit's step.
This module sits *below* the technique packages and never imports them: it reaches them only through the chain.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from lab.config import RunConfig, load_workload
from lab.loop import FitStats, Loader, ProgressFn, StepHook, StepPolicy, fit, make_optimizer, to_device
from lab.measure import environment_stamp
from lab.result import RunResult, new_run_id, timeline, utc_now_iso
from lab.result.failure import first_line, raised_at, user_files
from lab.technique import FitPlan, TechniqueChain, default_chain
from lab.workloads import Datasets, SizeSpec, Workload, get_workload

# ------------------------------------------------------------------------------------------- resolving


@dataclass(frozen=True)
class Resolved:
    """The config with the workload's size defaults filled in: what actually ran."""

    workload: Workload
    spec: SizeSpec
    device: torch.device
    epochs: int
    batch_size: int
    lr: float


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when present, else CPU; asking for CUDA without it is an error, not a fallback."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} is invalid: CUDA is not available on this machine (use cpu or auto)")
    return torch.device(name)


def resolve(cfg: RunConfig) -> Resolved:
    """Fill ``None`` fields from the workload's size spec and pick the device."""
    wl = get_workload(cfg.workload)
    spec = wl.spec_at(cfg.size, cfg.model_scale)  # the size's model, or a ladder rung's on the same data
    return Resolved(workload=wl, spec=spec, device=resolve_device(cfg.device),
                    epochs=cfg.epochs or spec.epochs, batch_size=cfg.batch_size or spec.batch_size,
                    lr=cfg.lr or spec.lr)


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
            batch = to_device(tuple(t[i:i + batch_size] for t in tensors[:-1]), device)
            outs.append(model(*batch).float().cpu())
        return {k: float(v) for k, v in wl.evaluate(torch.cat(outs), tensors[-1]).items()}
    finally:
        model.train(was_training)


def describe_step(plan: FitPlan, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What one fit's step was made of, for ``result.details["steps"][phase]``: two fits that should run
    the same step (a run and its ideal-loader replay) can be compared on this."""
    policy = plan.policy
    return {"optimizer": type(optimizer).__name__, "fused": bool(optimizer.defaults.get("fused")),
            "precision": getattr(policy, "dtype", "fp32") if policy is not None else "fp32",
            "compiled": plan.forward is not None, "ddp": plan.ddp is not None, "loader": type(plan.loader).__name__,
            "micro_batches": plan.micro_batches}


# -------------------------------------------------------------------------------------------- context


@dataclass
class TrainContext:
    """What a technique gets to work with: the run's config, data, device and result record, and
    :meth:`fit` / :meth:`evaluate`, so that fine-tuning after pruning or QAT and every study reuse the
    same measured loop instead of writing a second one. Techniques record their figures in
    ``result.details[family]`` and their "why" tags in ``result.why``; what a family remembers between
    the fits of one run (the resolved ``auto`` precision, a pruning schedule) lives in ``state``."""

    cfg: RunConfig
    resolved: Resolved
    data: Datasets
    result: RunResult
    techniques: TechniqueChain = field(default_factory=default_chain)
    progress: ProgressFn | None = None
    ddp: Any = None  # lab.distributed.DDPRuntime when data-parallel (set by its launcher's join); None = one process
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.resolved.device

    @property
    def workload(self) -> Workload:
        return self.resolved.workload

    @property
    def is_main_rank(self) -> bool:
        """Only rank 0 evaluates and reports; a single process is rank 0."""
        return self.ddp is None or self.ddp.info.rank == 0

    def new_model(self) -> nn.Module:
        """The workload's model, seeded with ``cfg.seed`` (same config, same initial weights), on the device."""
        seed_everything(self.cfg.seed)
        return self.workload.make_model(self.resolved.spec).to(self.device)

    def steps_per_epoch(self) -> int:
        """Loader batches in one epoch of this rank's training loader, counted once per context (building a loader
        runs the whole chain's factories; in a data-parallel run ask after the join, as :mod:`lab.train` does)."""
        if "steps_per_epoch" not in self.state:
            self.state["steps_per_epoch"] = len(self.make_loader())
        return self.state["steps_per_epoch"]

    def total_steps(self, *, max_steps: bool = True) -> int:
        """Optimizer steps the run's schedule takes: epochs x (loader batches // ``ddp.grad_accum_steps``), capped
        by ``cfg.max_steps`` (unless ``max_steps=False``: the full schedule), as :func:`lab.loop.fit` counts them
        (a step is ``grad_accum_steps`` micro-batches). The one place this is computed: a schedule sized by batches
        instead overshoots by the accumulation factor and then jumps to its target at the end (the gradual pruner
        did)."""
        total = self.resolved.epochs * (self.steps_per_epoch() // self.cfg.ddp.grad_accum_steps)
        return total if self.cfg.max_steps is None or not max_steps else min(total, self.cfg.max_steps)

    def make_loader(self, batch_size: int | None = None) -> Loader:
        """A loader over the training split as the config asks (same batch order for the same seed): the
        data technique builds it, the distributed one slices it per rank."""
        return self.techniques.loader_factory(self)(batch_size or self.resolved.batch_size)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return evaluate(model, self.workload, self.data.test, self.device, self.cfg.eval_batch_size)

    def fit(self, model: nn.Module, *, epochs: int, lr: float, max_steps: int | None = None,
            step_hooks: Sequence[StepHook] = (), phase: str = "train", loader: Loader | None = None,
            policy: StepPolicy | None = None, probe: bool = False) -> FitStats:
        """Train ``model`` in place the way the config asks (its optimizer, loader, precision, compile, DDP);
        returns the raw per-step samples. The main training phase, every fine-tune and every study go
        through here. ``loader`` / ``policy`` override what the techniques would build (a replay of cached
        batches; one arm of the precision probe)."""
        plan = FitPlan(phase=phase, lr=lr, probe=probe, loader=loader if loader is not None else self.make_loader(),
                       policy=policy)
        self.techniques.fit_options(self, model, plan)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = plan.optimizer(params, lr) if plan.optimizer is not None else \
            make_optimizer(self.cfg.optimizer, params, lr, fused=plan.fused_optimizer)
        every = self.eval_every(phase, probe)
        stats = fit(model, optimizer, plan.loader, self.workload, self.device, epochs=epochs, max_steps=max_steps,
                    step_hooks=step_hooks, progress=None if probe else self.progress, phase=phase,
                    policy=plan.policy, ddp=plan.ddp, forward=plan.forward, checkpoint=plan.checkpoint,
                    evaluate=self._metric_of(model) if every else None, eval_every=every,
                    micro_batches=plan.micro_batches)
        for done in plan.finished:
            done(stats)
        if not probe:
            self.result.details.setdefault("steps", {})[phase] = describe_step(plan, optimizer)
            if every:
                self.result.details.update(eval_curve=stats.evals, eval_s=stats.eval_s, eval_every=every)
            if stats.checkpoint_s:
                details = self.result.details
                details["checkpoint_s"] = details.get("checkpoint_s", 0.0) + stats.checkpoint_s
        return stats

    def eval_every(self, phase: str, probe: bool) -> int | None:
        """Steps between evaluations of the main training phase: ``cfg.eval_every``, once per epoch
        when only ``cfg.target_metric`` is set, else None (no evaluation during training)."""
        if phase != "train" or probe or (self.cfg.eval_every is None and self.cfg.target_metric is None):
            return None
        return self.cfg.eval_every or max(1, self.steps_per_epoch() // self.cfg.ddp.grad_accum_steps)

    def _metric_of(self, model: nn.Module) -> Callable[[], float]:
        """The primary metric of ``model`` on the test split (a DDP wrapper's module: no collective inside,
        every rank evaluates alike)."""
        inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        return lambda: self.evaluate(inner)[self.workload.metric_name]


@contextlib.contextmanager
def prepare(cfg: RunConfig, *, progress: ProgressFn | None = None,
            techniques: TechniqueChain | None = None) -> Iterator[TrainContext]:
    """Everything a run or a study needs, once: the resolved config, the thread count (restored on exit),
    the data, the technique chain (``None``: :func:`lab.technique.default_chain`) and an empty result record
    stamped with the environment. ``with prepare(cfg) as ctx: model = ctx.new_model();
    ctx.fit(model, epochs=ctx.resolved.epochs, lr=ctx.resolved.lr)``."""
    chain = default_chain() if techniques is None else techniques
    started = time.time()
    cfg = load_workload(cfg)  # a workload spec imported (and recorded as the name it registers) here
    r = resolve(cfg)
    result = RunResult(run_id=new_run_id(), config=cfg.to_dict(), env={}, workload=cfg.workload,
                       started_at=utc_now_iso(), metric_name=r.workload.metric_name,
                       higher_is_better=r.workload.higher_is_better, batch_size=r.batch_size,
                       warmup_steps=cfg.warmup_steps)
    with thread_count(cfg.threads):
        result.env = environment_stamp(str(r.device))
        try:
            made = r.workload.make_data(r.spec, cfg.data_seed)
        except Exception as exc:  # the user's data code: one line naming its line, before any work (no traceback)
            where, code, _ = raised_at(exc, user_files(None, [r.workload.make_data]))
            raise ValueError(f"workload {r.workload.name!r}: make_data raised {type(exc).__name__}: "
                             f"{first_line(exc)}" + (f" at {where} `{code}`" if where else "")) from exc
        data = fit_to_size(made, r.spec, r.workload.name)
        yield TrainContext(cfg=cfg, resolved=r, data=data, result=result, techniques=chain, progress=progress)
    if os.environ.get("LAB_LAUNCHER") == "spawn" and cfg.ddp.world_size > 1:  # a spawned rank: its start-up
        result.details["ddp_spawn_s"] = max(0.0, started - _process_started())
    timeline.finalize(result)  # details["one_off_s"], and the time to target when the config names one


def _process_started() -> float:
    """This process's creation time (epoch seconds)."""
    import psutil

    return psutil.Process().create_time()


def fit_to_size(data: Datasets, spec: SizeSpec, name: str) -> Datasets:
    """The lab, not the workload, enforces ``SizeSpec.n_train`` / ``n_test``: a longer split is cut to the
    size, a shorter one is used as it is and ``data.info["size_note"]`` says so."""
    if not isinstance(data, Datasets):
        raise ValueError(f"workload {name!r}: make_data returned {type(data).__name__}, "
                         "expected lab.workloads.Datasets")
    notes = []
    for split, want in (("train", spec.n_train), ("test", spec.n_test)):
        tensors = getattr(data, split)
        have = len(tensors[0])
        if have > want:
            setattr(data, split, tuple(t[:want] for t in tensors))
        elif have < want:
            notes.append(f"{split}: make_data gave {have} rows, fewer than the size's n_{split}={want}; using {have}")
    if notes:
        data.info = {**data.info, "size_note": "; ".join(notes)}
    return data
