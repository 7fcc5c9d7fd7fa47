"""Loaders over in-memory tensors, sharing one batch order so that any two loaders can be compared.

Why whole batches: a per-sample ``__getitem__`` over an in-memory tensor costs about 100x a direct slice,
so both loaders here gather a batch with one index operation per tensor. The ``dataloader`` loader is
``torch.utils.data.DataLoader`` with a batch sampler (``batch_size=None``): workers, prefetching and pinned
memory come from PyTorch itself, and the batches are exactly those of :class:`InMemoryLoader` for the same
seed and epoch, which is what lets a test check that a faster loader changes nothing but speed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from lab.config import DataConfig

Batch = tuple[torch.Tensor, ...]


class ShuffledBatchSampler(Sampler[torch.Tensor]):
    """Yields index tensors, one per batch; a fresh permutation per epoch derived from (seed, epoch)."""

    def __init__(self, n: int, batch_size: int, *, shuffle: bool = True, drop_last: bool = True,
                 seed: int = 0) -> None:
        if n <= 0:
            raise ValueError(f"dataset is empty (n={n})")
        if batch_size > n and drop_last:
            raise ValueError(f"batch_size={batch_size} is larger than the dataset ({n} rows) with drop_last")
        self.n, self.batch_size, self.shuffle, self.drop_last, self.seed = n, batch_size, shuffle, drop_last, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.n, generator=g)
        else:
            order = torch.arange(self.n)
        for i in range(len(self)):
            yield order[i * self.batch_size:(i + 1) * self.batch_size]


class TensorBatchDataset(Dataset):
    """A dataset indexed by a whole batch of indices at once (for ``DataLoader(batch_size=None)``)."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = tuple(tensors)

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, idx: torch.Tensor) -> Batch:
        return tuple(t[idx] for t in self.tensors)


class InMemoryLoader:
    """The fastest possible loader on one core: index-slice tensors already in memory."""

    def __init__(self, tensors: Sequence[torch.Tensor], sampler: ShuffledBatchSampler) -> None:
        self.tensors, self.sampler = tuple(tensors), sampler

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Batch]:
        for idx in self.sampler:
            yield tuple(t[idx] for t in self.tensors)


class _EpochDataLoader(DataLoader):
    """DataLoader whose batch order follows ``set_epoch`` like the other loaders."""

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)  # type: ignore[union-attr]


def make_loader(tensors: Sequence[torch.Tensor], cfg: DataConfig, batch_size: int, *, seed: int = 0,
                device: torch.device | str | None = None):
    """Build the loader that ``cfg.loader`` names; every loader yields the same batches in the same order
    for the same seed, so swapping loaders changes speed only. ``cfg.storage`` makes each batch read cost
    what the emulated storage preset says (:mod:`lab.data.storage`). ``device`` is used only by
    ``device_prefetch`` (a pass-through on CPU)."""
    from lab.data.prefetch import DevicePrefetcher, EmulatedBatchDataset, NaiveLoader, ThreadPrefetcher

    sampler = ShuffledBatchSampler(len(tensors[0]), batch_size, shuffle=cfg.shuffle, drop_last=cfg.drop_last,
                                   seed=seed)
    if cfg.loader == "memory":
        return InMemoryLoader(tensors, sampler)
    if cfg.loader == "dataloader":
        dataset = TensorBatchDataset(tensors) if cfg.storage == "none" else EmulatedBatchDataset(tensors,
                                                                                                 cfg.storage)
        return _EpochDataLoader(
            dataset, sampler=sampler, batch_size=None, num_workers=cfg.num_workers,
            pin_memory=cfg.pin_memory, prefetch_factor=cfg.prefetch_factor,
            persistent_workers=cfg.persistent_workers)
    naive = NaiveLoader(tensors, sampler, cfg.storage)
    if cfg.loader == "naive":
        return naive
    if cfg.loader == "thread":
        return ThreadPrefetcher(naive, cfg.prefetch_depth)
    if cfg.loader == "device_prefetch":
        return DevicePrefetcher(ThreadPrefetcher(naive, cfg.prefetch_depth), device)
    raise NotImplementedError(f"data.loader={cfg.loader!r} is not implemented (allowed: {DataConfig.LOADERS})")
