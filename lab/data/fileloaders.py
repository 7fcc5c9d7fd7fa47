"""Loaders over the file-backed source: every built-in loader reads shards and decodes samples.

Why a shard-aware order: a global shuffle over files touches every shard in every batch, so real file
loaders (WebDataset, tf.data) shuffle the *shard order* and then the rows inside a shard. :class:`ShardedBatchSampler`
does exactly that per (seed, epoch): every row once per epoch, a couple of shards per batch, the same order in
every loader. It yields ``(epoch, indices)``, so a worker process (even a persistent one) knows which epoch's
augmentation to apply without being told.

:class:`FileBatchDataset` is map-style and batch-indexed: ``dataset[(epoch, idx)]`` reads the shards that
hold ``idx`` through the emulated store (real bytes, plus the preset's latency and bandwidth), decodes and
augments each sample, and appends a small stats tuple (bytes and files read, read / decode seconds, the
reading thread's CPU seconds, the worker id). The loader wrappers strip that tuple in the training process
and add it to :class:`ReadStats`, which works the same for worker processes and threads. Built by
:func:`make_file_loader` for ``naive`` / ``thread`` / ``device_prefetch`` / ``dataloader``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from lab.config import DataConfig
from lab.data.decode import Augment, decode_png, to_model_input
from lab.data.files import FileSet
from lab.data.prefetch import DevicePrefetcher, ThreadPrefetcher
from lab.data.sampler import FollowsOrder, ShuffledBatchSampler

Batch = tuple[torch.Tensor, ...]
N_STATS = 6  # bytes, files, read_s, decode_s, cpu_s, worker
#: A worker sends its batch as numpy arrays, pickled by value through the pipe, instead of tensors in shared
#: memory. Why: each shared-memory tensor is a file descriptor the training process must fetch from the
#: worker (a round trip that waits until the worker is scheduled), which on a loaded 2-core box costs
#: milliseconds per tensor; copying a batch of a few hundred kB costs tens of microseconds.
COPY_FROM_WORKERS = True


def _as_is(batch: tuple) -> tuple:
    """The DataLoader's collate for file batches: keep what the dataset returned (numpy from a worker)."""
    return batch


class ShardedBatchSampler(ShuffledBatchSampler):
    """Per (seed, epoch): shuffle the shard order, then the rows inside each shard; cut into batches.
    ``skip(n)`` makes the next pass start at batch ``n`` (a resumed epoch), once; epochs, skips and the batch
    count are the in-memory sampler's, only the order differs (shard-local, so a batch reads few shards)."""

    def __init__(self, shard_rows: list[int], batch_size: int, *, shuffle: bool = True, drop_last: bool = True,
                 seed: int = 0) -> None:
        if sum(shard_rows) <= 0:
            raise ValueError(f"the file source is empty (shards rows={shard_rows})")
        super().__init__(sum(shard_rows), batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
        self.starts = np.concatenate([[0], np.cumsum(shard_rows)]).astype(np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """Every row index once, in the order the epoch reads them."""
        k = len(self.starts) - 1
        if not self.shuffle:
            return np.arange(self.n)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        parts = []
        for s in torch.randperm(k, generator=g).tolist():
            lo, hi = int(self.starts[s]), int(self.starts[s + 1])
            parts.append(lo + torch.randperm(hi - lo, generator=g).numpy())
        return np.concatenate(parts)

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        order, skip, self._skip = torch.from_numpy(self.order(self.epoch)), self._skip, 0
        for i in range(skip, len(self)):
            yield self.epoch, order[i * self.batch_size:(i + 1) * self.batch_size]


class FileBatchDataset(Dataset):
    """``dataset[(epoch, idx)]`` -> ``(*tensors, stats tuple)`` read and decoded from ``files`` (see the module)."""

    def __init__(self, files: FileSet, storage: str = "none", *, seed: int = 0,
                 augment: Augment | None = None) -> None:
        self.files, self.storage, self.seed, self.augment = files, storage, seed, augment
        self.starts = np.concatenate([[0], np.cumsum(files.shard_rows)]).astype(np.int64)
        self._store = None
        self._cached: tuple[int, object] | None = None  # the last shard read (a batch often shares it)
        self._draws: tuple[int, tuple[np.ndarray, np.ndarray]] | None = None

    def __len__(self) -> int:
        return self.files.rows

    def __getstate__(self) -> dict:  # a worker process gets a fresh store and cache
        return {**self.__dict__, "_store": None, "_cached": None, "_draws": None}

    def _shard(self, k: int, counts: list[float]) -> object:
        if self._cached is not None and self._cached[0] == k:
            return self._cached[1]
        if self._store is None:
            self._store = self.files.store(self.storage)
        before, t0 = self._store.bytes_read, time.perf_counter()
        rows = self.files.read(self._store, k)
        counts[0] += self._store.bytes_read - before
        counts[1] += 1
        counts[2] += time.perf_counter() - t0
        self._cached = (k, rows)
        return rows

    def _epoch_draws(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if self._draws is None or self._draws[0] != epoch:
            self._draws = (epoch, self.augment.draws(len(self), seed=self.seed, epoch=epoch))
        return self._draws[1]

    def __getitem__(self, item: tuple[int, torch.Tensor]) -> Batch:
        epoch, idx = item
        cpu0, counts = time.thread_time(), [0.0, 0.0, 0.0, 0.0]
        idx = np.asarray(idx, dtype=np.int64)
        shard_of = np.searchsorted(self.starts, idx, side="right") - 1
        if self.files.kind == "tar":
            out = self._images(epoch, idx, shard_of, counts)
        else:
            out = self._columns(idx, shard_of, counts)
        worker = get_worker_info()
        if worker is not None and COPY_FROM_WORKERS:
            out = tuple(t.numpy() for t in out)  # pickled by value: see COPY_FROM_WORKERS
        # plain floats, not a tensor: pickled inline with the batch, no extra shared-memory segment per batch
        stats = (*counts, time.thread_time() - cpu0, float(-1 if worker is None else worker.id))
        return (*out, stats)

    def _columns(self, idx: np.ndarray, shard_of: np.ndarray, counts: list[float]) -> Batch:
        parts: list[list[np.ndarray]] = []
        positions = []
        first = np.sort(np.unique(shard_of, return_index=True)[1])
        for k in shard_of[first]:  # shard by shard in reading order, one read each; rows back in batch order below
            rows = self._shard(int(k), counts)
            where = np.flatnonzero(shard_of == k)
            local = idx[where] - self.starts[k]
            parts.append([a[local] for a in rows])
            positions.append(where)
        t0 = time.perf_counter()
        back = np.argsort(np.concatenate(positions), kind="stable")
        out = tuple(torch.from_numpy(np.concatenate([p[j] for p in parts])[back]) for j in range(len(parts[0])))
        counts[3] += time.perf_counter() - t0
        return out

    def _images(self, epoch: int, idx: np.ndarray, shard_of: np.ndarray, counts: list[float]) -> Batch:
        meta = self.files.manifest.meta
        offsets, flips = self._epoch_draws(epoch) if self.augment is not None else (None, None)
        images, labels = [], []
        for i, k in zip(idx.tolist(), shard_of.tolist(), strict=True):
            png, label = self._shard(k, counts)[i - int(self.starts[k])]
            t0 = time.perf_counter()
            img = decode_png(png)
            if self.augment is not None:
                img = self.augment.apply(img, offsets[i], bool(flips[i]))
            images.append(img)
            labels.append(label)
            counts[3] += time.perf_counter() - t0
        t0 = time.perf_counter()
        x = to_model_input(images, meta["normalise_mean"], meta["normalise_std"])
        y = torch.tensor(labels, dtype=getattr(torch, meta["label_dtype"]))
        counts[3] += time.perf_counter() - t0
        return x, y


@dataclass
class ReadStats:
    """What the file loaders did, summed in the training process over every batch they delivered."""

    batches: int = 0
    bytes_read: int = 0
    files_read: int = 0
    read_s: float = 0.0
    decode_s: float = 0.0
    cpu_s_by_worker: dict[int, float] = field(default_factory=dict)  # -1: the training process's threads
    process_cpu_s: float = 0.0  # the training process's CPU seconds while its loaders iterated (all threads)

    def add(self, stats: tuple[float, ...]) -> None:
        b, f, r, d, cpu, w = (float(x) for x in stats)
        self.batches += 1
        self.bytes_read += int(b)
        self.files_read += int(f)
        self.read_s += r
        self.decode_s += d
        self.cpu_s_by_worker[int(w)] = self.cpu_s_by_worker.get(int(w), 0.0) + cpu

    def to_dict(self) -> dict:
        per = max(self.batches, 1)
        return {"batches": self.batches, "files_read": self.files_read, "bytes_read": self.bytes_read,
                "read_ms_per_batch": 1e3 * self.read_s / per, "decode_ms_per_batch": 1e3 * self.decode_s / per,
                "loader_cpu_s_by_worker": {str(k): v for k, v in sorted(self.cpu_s_by_worker.items())},
                "process_cpu_s": self.process_cpu_s}


class FileLoader(FollowsOrder):
    """The naive file loader: the training thread reads and decodes each batch, then steps."""

    def __init__(self, dataset: FileBatchDataset, sampler: ShardedBatchSampler, stats: ReadStats) -> None:
        self.dataset, self.sampler, self.stats = dataset, sampler, stats

    def __iter__(self) -> Iterator[Batch]:
        cpu0 = time.process_time()
        try:
            for item in self.sampler:
                *batch, stats = self.dataset[item]
                self.stats.add(stats)
                yield tuple(batch)
        finally:
            self.stats.process_cpu_s += time.process_time() - cpu0


class FileDataLoader(DataLoader, FollowsOrder):
    """``torch.utils.data.DataLoader`` over :class:`FileBatchDataset`: workers read and decode."""

    def __init__(self, *args, stats: ReadStats, pin: bool = False, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.stats, self.pin = stats, pin

    def __iter__(self) -> Iterator[Batch]:  # type: ignore[override]
        cpu0 = time.process_time()
        try:
            for *batch, stats in super().__iter__():
                self.stats.add(stats)
                out = tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in batch)
                yield tuple(t.pin_memory() for t in out) if self.pin else out
        finally:
            self.stats.process_cpu_s += time.process_time() - cpu0


def make_file_loader(files: FileSet, cfg: DataConfig, batch_size: int, *, seed: int = 0,
                     device: torch.device | str | None = None, stats: ReadStats | None = None,
                     augment: Augment | None = None):
    """The loader ``cfg.loader`` names, reading ``files`` (``memory`` is refused by the config: it reads none)."""
    stats = ReadStats() if stats is None else stats
    sampler = ShardedBatchSampler(files.shard_rows, batch_size, shuffle=cfg.shuffle, drop_last=cfg.drop_last,
                                  seed=seed)
    dataset = FileBatchDataset(files, cfg.storage, seed=seed, augment=augment)
    if cfg.loader == "dataloader":
        # pinned here, after the numpy arrays from the workers are tensors again
        return FileDataLoader(dataset, sampler=sampler, batch_size=None, num_workers=cfg.num_workers,
                              collate_fn=_as_is, prefetch_factor=cfg.prefetch_factor,
                              persistent_workers=cfg.persistent_workers, stats=stats,
                              pin=cfg.pin_memory and torch.cuda.is_available())
    naive = FileLoader(dataset, sampler, stats)
    if cfg.loader == "naive":
        return naive
    if cfg.loader == "thread":
        return ThreadPrefetcher(naive, cfg.prefetch_depth)
    if cfg.loader == "device_prefetch":
        return DevicePrefetcher(ThreadPrefetcher(naive, cfg.prefetch_depth), device)
    raise ValueError(f"data.loader={cfg.loader!r} is invalid with data.source='files': allowed: naive, thread, "
                     "device_prefetch, dataloader")
