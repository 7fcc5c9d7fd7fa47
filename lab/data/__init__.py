"""Data loading: how batches reach the model, and what waiting for them costs.

Loaders (:data:`lab.registry.LOADERS`, built in :mod:`.loaders`) over one shared batch order (:mod:`.sampler`),
the bounded thread prefetcher and the CUDA-stream prefetcher (:mod:`.prefetch`), emulated remote storage
(:data:`lab.registry.STORAGES`, :mod:`.storage`), Parquet shards with a manifest (:mod:`.shards`), shard
assignment and its skew (:mod:`.sharding`), and the studies that train through :func:`lab.context.prepare`
(:mod:`.studies`: stall analysis and the ideal-loader bound, skew cost, the auto-tuner).

The file-backed source (``data.source="files"``: :mod:`.files` writes, :mod:`.decode` decodes and augments,
:mod:`.fileloaders` reads through every loader) and checkpoint / mid-epoch resume (:mod:`.checkpoint`).

The family's technique (:class:`DataLoading`, see :mod:`lab.technique`): ``loader_factory`` builds every fit's
loader from ``cfg.data`` (files written once per run context, then read by every loader); ``fit_options`` hands the
main fit its checkpoint hook; ``after_training`` records the ideal bound of every run (the step without its data
wait; with ``data.ideal_replay`` also the replay of cached batches through the same step), the file reads, and the
"data-bound" why tag. Taught in ``notebooks/01_data_loading.ipynb``."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lab.config import DataConfig, RunConfig
from lab.context import TrainContext
from lab.data import portable as portable_
from lab.data.checkpoint import Checkpointer, checkpoints_root, load_checkpoint, resolve_checkpoint
from lab.data.decode import Augment
from lab.data.fileloaders import ReadStats, make_file_loader
from lab.data.files import FileSet, write_files
from lab.data.loaders import LoaderSpec, TensorBatchDataset, make_loader
from lab.data.prefetch import DevicePrefetcher, NaiveLoader, ThreadPrefetcher
from lab.data.sampler import InMemoryLoader, ShuffledBatchSampler
from lab.data.studies.skew import rank_partition
from lab.data.studies.stalls import CachedLoader
from lab.data.studies.threads import recommend
from lab.loop import Loader
from lab.registry import FAMILIES, LOADERS
from lab.result import RunResult
from lab.technique import FitPlan, Option, Portable, Technique
from lab.timed import TRAIN, Bench, NotTimed, TimedArm

__all__ = ["DATA_BOUND_SHARE", "DevicePrefetcher", "InMemoryLoader", "LoaderSpec", "NaiveLoader",
           "ShuffledBatchSampler", "TensorBatchDataset", "ThreadPrefetcher", "TECHNIQUE",
           "DataLoading", "data_bound_why", "files_for", "make_loader"]

#: A run whose measured steps wait for data more than this share of the time is tagged "data-bound".
DATA_BOUND_SHARE = 0.10
#: Steps the ideal-loader replay (``data.ideal_replay``) runs: enough for a median after the warm-up.
REPLAY_STEPS = 20
#: The augmentation the file-backed image source applies (flip off: a mirrored digit is another glyph).
IMAGE_AUGMENT = Augment(pad=2, flip_p=0.0)


def files_for(ctx: TrainContext) -> FileSet:
    """The run's training split as shard files under ``$LAB_CACHE_DIR`` (written once, then reused)."""
    files = ctx.state.get("data_files")
    if files is None:
        files = write_files(ctx.data.train, ctx.data.info, workload=ctx.workload.name)
        ctx.state["data_files"] = files
    return files


def _read_stats(ctx: TrainContext) -> ReadStats:
    return ctx.state.setdefault("data_read_stats", ReadStats())


def _replay_step_ms(ctx: TrainContext) -> float | None:
    """The ideal bound measured: ``REPLAY_STEPS`` batches read first (untimed), then trained from memory on a
    fresh copy of the run's model through ``ctx.fit`` (same optimizer, precision, compile and techniques)."""
    from lab.data.studies.stalls import replay_cached, stall_summary

    stats = replay_cached(ctx, REPLAY_STEPS, lambda: ctx.techniques.before_training(ctx, ctx.new_model()),
                          phase="ideal_replay", fewest=ctx.cfg.warmup_steps + 2)
    if stats is None:
        return None
    times = {k: v[ctx.cfg.warmup_steps:] for k, v in stats.step_times_ms.items()}
    summary = stall_summary(times, skip=0)
    return summary["compute_ms"] + summary["data_wait_ms"]


def data_bound_why(wait_fraction: float | None, ideal_ms: float | None, median_ms: float | None,
                   replay_ms: float | None = None, *, workers: int = 0, in_memory: bool = False) -> str | None:
    """The "data-bound" why tag when the loader costs more than :data:`DATA_BOUND_SHARE` of the step: by the
    measured data wait, or (with a replay) by the gap between the run's step and the replayed one. The remedy
    follows the loader that waited: ``workers`` processes over ``in_memory`` rows wait on their own hand-over
    (each batch pickled across a process boundary), which more workers only multiply."""
    if not median_ms:
        return None
    if wait_fraction is not None and wait_fraction > DATA_BOUND_SHARE:
        if workers and in_memory:
            remedy = (f"its {workers} worker process(es) hand every batch across a process boundary, and with the "
                      "rows already in memory that hand-over is the wait: the main-process loader or a thread "
                      "prefetcher avoids it, more workers would not")
        else:
            remedy = ("a prefetching loader, more reads in flight (data.prefetch_readers) or "
                      f"{'more' if workers else 'loader'} workers would help")
        return (f"data-bound: {100 * wait_fraction:.0f}% of the step waits for data (ideal step {ideal_ms:.3g} ms "
                f"vs {median_ms:.3g} ms measured; above the {100 * DATA_BOUND_SHARE:.0f}% threshold): {remedy}")
    if replay_ms and 1 - replay_ms / median_ms > DATA_BOUND_SHARE:
        return (f"data-bound: the replay of cached batches steps in {replay_ms:.3g} ms vs {median_ms:.3g} ms "
                f"measured (above the {100 * DATA_BOUND_SHARE:.0f}% threshold)")
    return None


def _record_data_path(ctx: TrainContext, model: nn.Module) -> nn.Module:
    """Record the ideal bound and the data path's work in ``result.details["data"]``; tag a data-bound run."""
    cfg, result = ctx.cfg, ctx.result
    median_ms, ideal_ms, wait = result.median_step_ms, result.ideal_step_ms, result.data_wait_fraction
    data: dict[str, Any] = {"source": cfg.data.source, "median_step_ms": median_ms, "ideal_step_ms": ideal_ms,
                            "data_wait_fraction": wait,
                            "data_bound_share": (1 - ideal_ms / median_ms) if median_ms and ideal_ms else None,
                            "data_bound_threshold": DATA_BOUND_SHARE}
    if cfg.data.source == "files":
        files = ctx.state.get("data_files")
        data.update(_read_stats(ctx).to_dict())
        if files is not None:
            data.update({"format": files.kind, "folder": str(files.root), "shards": len(files.shard_rows),
                         "bytes_on_disk": files.nbytes,
                         "augment": IMAGE_AUGMENT.__dict__ if files.kind == "tar" else None})
        if ideal_ms:
            loader_ms = data["read_ms_per_batch"] + data["decode_ms_per_batch"]
            data["recommendation"] = recommend(os.cpu_count() or 1, loader_ms, ideal_ms)["text"]
    if "checkpoint" in ctx.state:
        result.details["checkpoint"] = ctx.state["checkpoint"].describe()
    if cfg.data.ideal_replay and ctx.is_main_rank:
        replay = _replay_step_ms(ctx)
        data["replay_step_ms"] = replay
        if replay and median_ms:
            data["data_bound_share"] = max(0.0, 1 - replay / median_ms)
    result.details["data"] = data
    workers = cfg.data.num_workers if LOADERS.get(cfg.data.loader).worker_processes else 0
    why = data_bound_why(wait, ideal_ms, median_ms, data.get("replay_step_ms"), workers=workers,
                         in_memory=cfg.data.source == "memory")
    if why:
        result.why.append(why)
    return model


def _endless(bench: Bench, cfg: DataConfig) -> Callable[[], tuple[torch.Tensor, ...]]:
    """``next batch`` of an endless pass over the bench's training rows through the loader ``cfg`` builds."""
    loader = make_loader(bench.train_rows, cfg, bench.batch_size, seed=0)
    batches = itertools.chain.from_iterable(loader for _ in itertools.count())  # endless epochs
    return lambda: next(batches)


class DataLoading(Technique):
    """Every fit's loader from ``cfg.data`` (in memory or shard files), checkpoint / resume, the ideal bound."""

    name = "data"

    def timed(self, option: Option, bench: Bench, arm: TimedArm) -> None:
        """The arm's step fed by a ``DataLoader`` with the option's worker processes (persistent, prefetch 2) over
        the rung's training rows, against its own baseline: the same step fed by the in-memory loader (a loader
        changes what feeds the step, so the fixed batch is not its baseline). Other loaders are not timed here."""
        o = option.overrides
        if arm.axis != TRAIN or o.get("data.loader") != "dataloader" or not o.get("data.num_workers"):
            raise NotTimed(f"{option.name}: the map times DataLoader worker processes feeding the training step")
        workers = int(o["data.num_workers"])
        arm.own_baseline = arm.but(batches=_endless(bench, DataConfig()))
        arm.batches = _endless(bench, DataConfig(loader="dataloader", num_workers=workers, persistent_workers=True,
                                                 prefetch_factor=2))
        arm.notes.append(f"vs the same step fed by the in-memory loader; {workers} DataLoader worker process"
                         f"{'es' if workers > 1 else ''} on the same cores as compute")

    def check(self, cfg: RunConfig) -> None:
        """A ``--resume`` checkpoint must exist and have been written by this config, before any work."""
        if cfg.resume is not None:
            load_checkpoint(resolve_checkpoint(cfg.resume), cfg.to_dict())
        if cfg.ddp.shard != "batch" and cfg.data.source == "files":
            raise ValueError(f"ddp.shard={cfg.ddp.shard!r} is invalid with data.source='files': per-rank shards "
                             "are cut from the in-memory split; use --data-source memory")

    def loader_factory(self, ctx: TrainContext, make: Callable[[int], Loader] | None) -> Callable[[int], Loader]:
        """``batch size -> loader`` over the training split as ``cfg.data`` asks (the base every fit uses): over
        in-memory tensors, or over the shard files of ``data.source="files"``."""
        cfg = ctx.cfg
        if cfg.data.source == "files":
            def make_files(batch_size: int) -> Loader:
                files = files_for(ctx)
                augment = IMAGE_AUGMENT if files.kind == "tar" else None
                return make_file_loader(files, cfg.data, batch_size, seed=cfg.seed, device=ctx.device,
                                        stats=_read_stats(ctx), augment=augment)
            return make_files
        if cfg.ddp.shard != "batch" and ctx.ddp is not None and ctx.ddp.info.distributed:
            # Per-rank shards: this rank reads only its part, shuffled inside it; distributed keeps it whole.
            info = ctx.ddp.info
            rows = torch.from_numpy(rank_partition(ctx.data.train[-1], info.world_size, info.rank, cfg.ddp.shard,
                                                   order=cfg.ddp.shard_order, seed=cfg.seed))
            part = tuple(t[rows] for t in ctx.data.train)
            return lambda batch_size: make_loader(part, cfg.data, batch_size, seed=cfg.seed, device=ctx.device)
        return lambda batch_size: make_loader(ctx.data.train, cfg.data, batch_size, seed=cfg.seed, device=ctx.device)

    def fit_options(self, ctx: TrainContext, model: nn.Module, plan: FitPlan) -> None:
        """The main training fit (the first ``train`` phase over the run's own loader) gets the checkpoint hook."""
        cfg = ctx.cfg
        if (cfg.checkpoint_every is None and cfg.resume is None) or plan.phase != "train" or plan.probe \
                or isinstance(plan.loader, CachedLoader) or "checkpoint" in ctx.state:
            return
        folder = checkpoints_root() / ctx.result.run_id if cfg.checkpoint_every else None
        resume_from = resolve_checkpoint(cfg.resume) if cfg.resume is not None else None
        plan.checkpoint = ctx.state["checkpoint"] = Checkpointer(config=cfg.to_dict(), folder=folder,
                                                                 every=cfg.checkpoint_every, resume_from=resume_from)

    def after_training(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        return _record_data_path(ctx, model)

    def portable(self, cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
        """The loader as DataLoader keywords or a thread prefetcher, written out (:mod:`lab.data.portable`)."""
        return portable_.portable(cfg, run)

    def report(self, result: RunResult) -> dict[str, Any]:
        """Loader, storage, workers, source, and the share of the step spent waiting for data."""
        cfg = (result.config or {}).get("data", {})
        data = result.details.get("data") or {}
        return {"loader": cfg.get("loader"), "storage": cfg.get("storage"), "num_workers": cfg.get("num_workers"),
                "source": cfg.get("source", "memory"), "data_wait_fraction": result.data_wait_fraction,
                "ideal_step_ms": result.ideal_step_ms, "data_bound_share": data.get("data_bound_share"),
                "files_read": data.get("files_read"), "bytes_read": data.get("bytes_read")}


TECHNIQUE = FAMILIES.register(DataLoading.name, DataLoading(), overwrite=True)  # overwrite: reload idempotent
from lab.data import options  # noqa: E402, F401 - the family's option strings, registered with it
