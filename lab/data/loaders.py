"""Loaders over in-memory tensors, sharing one batch order so that any two loaders can be compared.

Why whole batches: a per-sample ``__getitem__`` over an in-memory tensor costs about 100x a direct slice,
so both loaders here gather a batch with one index operation per tensor. The ``dataloader`` loader is
``torch.utils.data.DataLoader`` with a batch sampler (``batch_size=None``): workers, prefetching and pinned
memory come from PyTorch itself, and the batches are exactly those of :class:`InMemoryLoader` for the same
seed and epoch, which is what lets a test check that a faster loader changes nothing but speed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from lab.config import DataConfig
from lab.data.prefetch import DevicePrefetcher, EmulatedBatchDataset, NaiveLoader, ThreadPrefetcher
from lab.data.sampler import FollowsOrder, InMemoryLoader, ShuffledBatchSampler
from lab.registry import LOADERS

Batch = tuple[torch.Tensor, ...]


class TensorBatchDataset(Dataset):
    """A dataset indexed by a whole batch of indices at once (for ``DataLoader(batch_size=None)``)."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = tuple(tensors)

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, idx: torch.Tensor) -> Batch:
        return tuple(t[idx] for t in self.tensors)


class _EpochDataLoader(DataLoader, FollowsOrder):
    """DataLoader whose batch order follows ``set_epoch`` (and ``skip``) like the other loaders."""


def make_loader(tensors: Sequence[torch.Tensor], cfg: DataConfig, batch_size: int, *, seed: int = 0,
                device: torch.device | str | None = None):
    """Build the loader that ``cfg.loader`` names; every loader yields the same batches in the same order
    for the same seed, so swapping loaders changes speed only. ``cfg.storage`` makes each batch read cost
    what the emulated storage preset says (:mod:`lab.data.storage`). ``device`` is used only by
    ``device_prefetch`` (a pass-through on CPU)."""
    sampler = ShuffledBatchSampler(len(tensors[0]), batch_size, shuffle=cfg.shuffle, drop_last=cfg.drop_last,
                                   seed=seed)
    return LOADERS.get(cfg.loader).build(tensors, sampler, cfg, device)


@dataclass(frozen=True)
class LoaderSpec:
    """One entry of :data:`lab.registry.LOADERS`: how to build the loader, and whether it reads in worker
    processes (``data.num_workers``) or in the training process."""

    build: Callable[..., object]  # (tensors, sampler, DataConfig, device) -> loader
    worker_processes: bool = False
    description: str = ""
    prefetch_depth: bool = False  # reads data.prefetch_depth (a bounded prefetch queue)


def _dataloader(tensors, sampler, cfg: DataConfig, device):  # noqa: ANN001, ANN202 - a LoaderSpec.build
    dataset = TensorBatchDataset(tensors) if cfg.storage == "none" else EmulatedBatchDataset(tensors, cfg.storage)
    return _EpochDataLoader(dataset, sampler=sampler, batch_size=None, num_workers=cfg.num_workers,
                            pin_memory=cfg.pin_memory, prefetch_factor=cfg.prefetch_factor,
                            persistent_workers=cfg.persistent_workers)


def _thread(tensors, sampler, cfg: DataConfig, device):  # noqa: ANN001, ANN202
    return ThreadPrefetcher(NaiveLoader(tensors, sampler, cfg.storage, cfg.prefetch_readers), cfg.prefetch_depth)


_BUILT_IN = {
    "memory": LoaderSpec(lambda t, s, cfg, dev: InMemoryLoader(t, s), description="slices of in-memory tensors"),
    "dataloader": LoaderSpec(_dataloader, worker_processes=True, description="torch.utils.data.DataLoader"),
    "naive": LoaderSpec(lambda t, s, cfg, dev: NaiveLoader(t, s, cfg.storage), description="one read per batch"),
    "thread": LoaderSpec(_thread, description="bounded background-thread prefetch", prefetch_depth=True),
    "device_prefetch": LoaderSpec(lambda t, s, cfg, dev: DevicePrefetcher(_thread(t, s, cfg, dev), dev),
                                  description="thread prefetch + copy to the GPU on a side CUDA stream",
                                  prefetch_depth=True),
}
for _name, _spec in _BUILT_IN.items():
    LOADERS.register(_name, _spec, overwrite=True)  # overwrite: importlib.reload stays idempotent
del _name, _spec
