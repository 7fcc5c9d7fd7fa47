"""Data-parallel training (DDP): launch, rank-aware batches, measured communication, failures that end.

Why: the seed's claim ("4 GPUs cut training time to 1/3-1/4, but communication makes small runs scale
poorly") can only be checked by running real DistributedDataParallel and timing its all-reduces.
:mod:`.launch` starts and joins ranks (torchrun, SLURM, spawn) with timeouts that name the dead rank;
:mod:`.ddp` is DDP in the one loop; :mod:`.scaling` is the alpha-beta model that projects the measurements to
N workers; :mod:`.checks` holds the worker functions the tests, notebook and benchmark spawn.

The family plugs into a run twice (see :mod:`lab.technique`). Its launcher (:class:`DataParallelLauncher`,
registered in :data:`lab.registry.LAUNCHERS`) starts and ends the run's processes: ``launch`` spawns the ranks,
``join`` enters the process group, ``wrap`` wraps the model (after the untrained evaluation), ``unwrap`` unwraps it
and records ``result.details["distributed"]``, ``leave`` leaves the group. Its technique (:class:`DataParallel`) is what
is per step: ``check`` refuses what cannot run, ``loader_factory`` slices every rank's share of the global batch,
``fit_options`` hands the loop the DDP runtime, ``report`` summarises. Taught in
``notebooks/05_distributed.ipynb``."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from lab.config import RunConfig
from lab.context import TrainContext, resolve_device
from lab.distributed import ddp, launch
from lab.distributed import portable as portable_
from lab.distributed.ddp import *  # noqa: F403 - the names in its __all__
from lab.distributed.ddp import WHY_CONTIGUOUS_BUFFERS, RankSlicedLoader, describe, setup_for_run, unwrap, wrap
from lab.distributed.launch import *  # noqa: F403 - the names in its __all__
from lab.distributed.launch import check_spawn_world_size, detect_launch, finish, resolve_backend, spawn_run
from lab.loop import Loader
from lab.registry import FAMILIES, LAUNCHERS
from lab.result import RunResult, section
from lab.technique import PROFILE_PHASE, FitPlan, Launcher, Portable, Technique

__all__ = [*ddp.__all__, *launch.__all__, "DataParallel", "DataParallelLauncher", "LAUNCHER", "PROFILE_PHASE",
           "TECHNIQUE", "profiled"]


def _distributed(ctx: TrainContext) -> bool:
    return ctx.ddp is not None and ctx.ddp.info.distributed


@contextlib.contextmanager
def profiled(ctx: TrainContext, model: nn.Module) -> Iterator[nn.Module]:
    """The model ``--profile`` trains: ``model`` itself in a single process; data-parallel, a fresh DDP wrap of it
    (the run's wrap is gone: the profiled copy must not move the trained model) with its own comm recorder,
    which ``ctx.ddp`` points at until the block ends. Every rank must enter it: DDP's construction and each
    step's all-reduces are collective."""
    if not _distributed(ctx):
        yield model
        return
    saved = ctx.ddp
    ctx.ddp = dataclasses.replace(saved, recorder=None)
    try:
        yield wrap(model, ctx.ddp, ctx.cfg.ddp, ctx.device)
    finally:
        ctx.ddp = saved


class DataParallelLauncher(Launcher):
    """How a data-parallel run starts and ends its processes: spawn the ranks (unless torchrun or srun did), join
    and leave their process group, wrap the model in DistributedDataParallel for the fit. Also single-process
    gradient accumulation (``ddp.grad_accum_steps`` > 1), whose ``no_sync`` runtime ``join`` sets up."""

    def applies(self, cfg: RunConfig) -> bool:
        """Several ranks or accumulation asked for, or a launcher (torchrun, srun) started this process as a rank:
        otherwise ``join`` would find nothing to join (:func:`lab.distributed.ddp.setup_for_run`) and every other
        method would do nothing, which is the single-process launcher."""
        return cfg.ddp.enabled or detect_launch().distributed

    def launch(self, cfg: RunConfig, run: Callable[[RunConfig], RunResult]) -> RunResult | None:
        """Several ranks asked for and no launcher started them: spawn one process per rank, each calling
        ``run(cfg)`` (it must be importable: :func:`lab.train.run`), and return rank 0's result."""
        if cfg.ddp.world_size > 1 and not detect_launch().distributed:
            return spawn_run(cfg, run)
        return None

    def join(self, ctx: TrainContext) -> None:
        """Join the process group (every rank), or set up single-process accumulation; ``ctx.ddp`` says which."""
        ctx.ddp, ctx.state["ddp.created_group"] = setup_for_run(ctx.cfg, ctx.device)

    def wrap(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        """Wrap in DistributedDataParallel when there are several ranks (after the untrained evaluation); buffers
        DDP could not broadcast into are made contiguous first, and ``why`` names them."""
        if ctx.ddp is None:
            return model
        before = len(ctx.ddp.buffers_made_contiguous)
        wrapped = wrap(model, ctx.ddp, ctx.cfg.ddp, ctx.device)
        if len(ctx.ddp.buffers_made_contiguous) > before:
            names = ", ".join(ctx.ddp.buffers_made_contiguous[before:])
            ctx.result.why.append(f"ddp: buffer(s) {names} made contiguous before wrapping: {WHY_CONTIGUOUS_BUFFERS}")
        return wrapped

    def unwrap(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        """Unwrap and record ranks, backend, effective batch and bytes per step."""
        if ctx.ddp is None:
            return model
        ctx.result.details[DataParallel.name] = describe(ctx.ddp, ctx.cfg, ctx.resolved.batch_size, ctx.resolved.lr)
        return unwrap(model)

    def leave(self, ctx: TrainContext) -> None:
        """Leave the process group this run created, after a barrier (every rank at the same point)."""
        if ctx.state.pop("ddp.created_group", False):
            finish()


class DataParallel(Technique):
    """DistributedDataParallel over several processes (and ``no_sync`` gradient accumulation in one), per step: its
    processes are :class:`DataParallelLauncher`'s."""

    name = "distributed"
    config_fields = ("ddp",)

    def check(self, cfg: RunConfig) -> None:
        """Refuse a backend this machine cannot run (NCCL without CUDA), and more ranks than this machine may
        spawn (:func:`lab.distributed.launch.check_spawn_world_size`), before spawning any rank."""
        if cfg.ddp.enabled:
            device = resolve_device(cfg.device)
            resolve_backend(cfg.ddp.backend, device)
            if cfg.ddp.world_size > 1 and not detect_launch().distributed:  # spawned here, not by torchrun / srun
                check_spawn_world_size(cfg.ddp.world_size, device)

    def loader_factory(self, ctx: TrainContext, make: Callable[[int], Loader] | None
                       ) -> Callable[[int], Loader] | None:
        """Data-parallel: every rank walks the same global batches (batch x world size) and keeps its slice;
        with ``ddp.shard`` set, each rank reads its own shard at its own batch size (the data technique builds
        it)."""
        if make is None or not _distributed(ctx) or ctx.cfg.ddp.shard != "batch":
            return make  # with ddp.shard, the data technique already built this rank's loader over its own shard
        info = ctx.ddp.info
        return lambda batch_size: RankSlicedLoader(make(batch_size * info.world_size), info.rank, info.world_size)

    def fit_options(self, ctx: TrainContext, model: nn.Module, plan: FitPlan) -> None:
        """The loop's ``ddp`` argument: ``no_sync`` accumulation and the comm timing (not for a probe, except the
        profiled steps, which must be the run's step)."""
        if not plan.probe or plan.phase == PROFILE_PHASE:
            plan.ddp = ctx.ddp

    def portable(self, cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
        """torchrun + ``init_process_group`` + ``DistributedSampler`` + DDP, written out
        (:mod:`lab.distributed.portable`)."""
        return portable_.portable(cfg, run)

    def report(self, result: RunResult) -> dict[str, Any]:
        """Ranks, effective batch and the share of the step in communication."""
        rec = section(result, self.name)
        phases = result.phase_medians_ms()
        total = phases.get("total") or float("nan")
        return {"world_size": rec.get("world_size", 1), "effective_batch": rec.get("effective_batch"),
                "comm_fraction": phases.get("comm", 0.0) / total if total == total else None}


TECHNIQUE = FAMILIES.register(DataParallel.name, DataParallel(), overwrite=True)  # overwrite: reload idempotent
LAUNCHER = LAUNCHERS.register(DataParallel.name, DataParallelLauncher(), overwrite=True)
