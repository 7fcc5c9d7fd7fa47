"""The batch order every loader shares, and the in-memory loader that is the upper bound for all of them.

Why one sampler: swapping loaders must change speed only, so every loader walks the same index batches
for the same (seed, epoch).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

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
        self.epoch, self._skip = 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip(self, batches: int) -> None:
        """Start the next pass at batch ``batches`` of the epoch's order (a resumed epoch), once."""
        self._skip = batches

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.n, generator=g)
        else:
            order = torch.arange(self.n)
        skip, self._skip = self._skip, 0
        for i in range(skip, len(self)):
            yield order[i * self.batch_size:(i + 1) * self.batch_size]


class FollowsOrder:
    """The base of every loader wrapper in :mod:`lab.data`: its batch order lives in :attr:`order` (by default
    ``self.sampler``; a prefetcher's is the loader it wraps), so ``set_epoch``, ``skip`` (start a resumed epoch
    mid-way) and ``len`` go there. A ``DataLoader`` subclass lists ``DataLoader`` first and keeps its own ``len``."""

    @property
    def order(self):  # noqa: ANN201 - a sampler or a loader: anything with set_epoch, skip and len
        return self.sampler  # type: ignore[attr-defined]

    def set_epoch(self, epoch: int) -> None:
        self.order.set_epoch(epoch)

    def skip(self, batches: int) -> None:
        self.order.skip(batches)

    def __len__(self) -> int:
        return len(self.order)


class InMemoryLoader(FollowsOrder):
    """The fastest possible loader on one core: index-slice tensors already in memory."""

    def __init__(self, tensors: Sequence[torch.Tensor], sampler: ShuffledBatchSampler) -> None:
        self.tensors, self.sampler = tuple(tensors), sampler

    def __iter__(self) -> Iterator[Batch]:
        for idx in self.sampler:
            yield tuple(t[idx] for t in self.tensors)
