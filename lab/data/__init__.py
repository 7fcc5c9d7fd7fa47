"""Data loading: how batches reach the model, and what waiting for them costs.

Loaders (:data:`lab.registry.LOADERS`, built in :mod:`.loaders`) over one shared batch order (:mod:`.sampler`),
the bounded thread prefetcher and the CUDA-stream prefetcher (:mod:`.prefetch`), emulated remote storage
(:data:`lab.registry.STORAGES`, :mod:`.storage`), Parquet shards with a manifest (:mod:`.shards`), shard
assignment and its skew (:mod:`.sharding`), and the studies that train through :func:`lab.context.prepare`
(:mod:`.studies`: stall analysis and the ideal-loader bound, skew cost, the auto-tuner).

The family's door (see :mod:`lab.context`): ``loader_factory`` builds every fit's loader from
``cfg.data``. Taught in ``notebooks/01_data_loading.ipynb``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from lab.config import RunConfig
from lab.context import TrainContext
from lab.data.loaders import LoaderSpec, TensorBatchDataset, make_loader
from lab.data.prefetch import DevicePrefetcher, NaiveLoader, ThreadPrefetcher
from lab.data.sampler import InMemoryLoader, ShuffledBatchSampler
from lab.loop import Loader, StepHook
from lab.result import RunResult

__all__ = ["DevicePrefetcher", "InMemoryLoader", "LoaderSpec", "NaiveLoader", "ShuffledBatchSampler",
           "TensorBatchDataset", "ThreadPrefetcher", "after_training", "before_training", "check", "loader_factory",
           "make_loader", "report"]


def check(cfg: RunConfig) -> None:
    """Nothing beyond the config's own validation: every registered loader runs on every device."""


def loader_factory(ctx: TrainContext, make: Callable[[int], Loader] | None) -> Callable[[int], Loader]:
    """``batch size -> loader`` over the training split as ``cfg.data`` asks (the base every fit uses)."""
    cfg = ctx.cfg
    return lambda batch_size: make_loader(ctx.data.train, cfg.data, batch_size, seed=cfg.seed, device=ctx.device)


def before_training(ctx: TrainContext, model: nn.Module) -> tuple[nn.Module, list[StepHook]]:
    return model, []


def after_training(ctx: TrainContext, model: nn.Module) -> nn.Module:
    return model


def report(result: RunResult) -> dict[str, Any]:
    """Loader, storage, workers and the share of the step spent waiting for data."""
    cfg = (result.config or {}).get("data", {})
    return {"loader": cfg.get("loader"), "storage": cfg.get("storage"), "num_workers": cfg.get("num_workers"),
            "data_wait_fraction": result.data_wait_fraction}
