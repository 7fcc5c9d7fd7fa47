"""The naive loader, the bounded thread prefetcher (the seed's idea done right) and a CUDA-stream prefetcher.

Why a bounded queue filled by a thread: reading the next batch (a network round trip, decompression) can
overlap the current step only if something runs while the step computes. A background thread suffices when
the read waits on I/O (sleeping and socket waits release the GIL). The queue must be *bounded*: an unbounded
one lets the reader run ahead until memory is gone (the seed's pitfall). And the prefetcher must *yield
batches* as they arrive: the seed's version read the whole epoch synchronously and returned its buffer, so
nothing overlapped and all but the last few batches were lost. See :func:`seed_prefetch_as_written`.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.utils.data import Dataset

from lab.data.omp import limit_this_thread
from lab.data.sampler import FollowsOrder, InMemoryLoader
from lab.data.storage import StoragePreset, pay, preset

Batch = tuple[torch.Tensor, ...]
_DONE = object()


def batch_nbytes(batch: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in batch)


def ordered_reads(read: Callable[[Any], Any], items: Iterable[Any], readers: int = 1) -> Iterator[Any]:
    """``read(item)`` for every item, in the items' order, with up to ``readers`` reads in flight at once.

    Why: a read from remote storage is mostly waiting (a round trip before the first byte). One reader pays
    every wait in turn, so once the step is faster than a read, no prefetch depth can keep up: the queue is
    empty and the step waits (ctr small, fully stacked: 25 % of the step on network_fs). Reads in flight
    overlap those waits; the emulated link still carries one transfer at a time (:mod:`lab.data.storage`),
    so they never add bandwidth. Threads, not processes: they sleep on I/O, hold no core, copy nothing
    between processes, and each runs its torch ops (the gather) on one OpenMP thread (:mod:`lab.data.omp`).
    Order is kept (the batches are the in-memory loader's, same order); a read's exception is raised at its
    turn; when the consumer stops, at most ``readers`` reads already started finish, nothing more is read."""
    if isinstance(readers, bool) or not isinstance(readers, int) or readers < 1:
        raise ValueError(f"data.prefetch_readers={readers!r} is invalid: must be an integer >= 1")
    if readers == 1:
        for item in items:
            yield read(item)
        return
    with ThreadPoolExecutor(readers, thread_name_prefix="lab-read", initializer=limit_this_thread,
                            initargs=(1,)) as pool:
        pending: collections.deque = collections.deque()
        try:
            for item in items:
                pending.append(pool.submit(read, item))
                if len(pending) >= readers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


class NaiveLoader(InMemoryLoader):
    """Main-thread loader: each batch is one read from (emulated) storage, then the step waits for it.
    Same batches, same order as :class:`lab.data.InMemoryLoader` for the same sampler. ``readers`` > 1: that
    many reads in flight at once (:func:`ordered_reads`; what the thread prefetcher's ``data.prefetch_readers``
    sets), the same batches in the same order."""

    def __init__(self, tensors: Sequence[torch.Tensor], sampler, storage: str | StoragePreset = "none",
                 readers: int = 1) -> None:
        super().__init__(tensors, sampler)
        self.cost, self.readers = preset(storage), readers

    def read(self, idx: torch.Tensor) -> Batch:
        """One batch: the gather, then the emulated storage's cost for its bytes."""
        started_s = time.perf_counter()
        batch = tuple(t[idx] for t in self.tensors)
        pay(self.cost, batch_nbytes(batch), started_s)
        return batch

    def __iter__(self) -> Iterator[Batch]:
        yield from ordered_reads(self.read, self.sampler, self.readers)


class EmulatedBatchDataset(Dataset):
    """A batch-indexed dataset (for ``DataLoader(batch_size=None)``) whose reads cost what ``storage`` says,
    inside the worker process that does the read."""

    def __init__(self, tensors: Sequence[torch.Tensor], storage: str | StoragePreset) -> None:
        self.tensors, self.cost = tuple(tensors), preset(storage)

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, idx: torch.Tensor) -> Batch:
        started_s = time.perf_counter()
        batch = tuple(t[idx] for t in self.tensors)
        pay(self.cost, batch_nbytes(batch), started_s)
        return batch


def seed_prefetch_as_written(loader: Iterable[Batch], depth: int) -> list[Batch]:
    """The seed's prefetcher, kept to show its bug (logic paraphrased): it reads the *whole* loader in the
    calling thread, keeps a sliding window of the last ``depth`` batches, and *returns the buffer*. So no
    read overlaps compute, the caller waits for the entire epoch before the first step, and every batch
    but the last ``depth`` is dropped. Do not use; :class:`ThreadPrefetcher` is the fix."""
    buffer: list[Batch] = []
    for batch in loader:
        buffer.append(batch)
        if len(buffer) > depth:
            buffer.pop(0)
    return buffer


class ThreadPrefetcher(FollowsOrder):
    """Wraps any loader; a background thread keeps up to ``depth`` batches ready. Yields the wrapped
    loader's batches in its order, re-raises the reader's exception in the training loop, and stops the
    thread when the consumer stops early (``max_steps``). The reader's own torch ops run on one OpenMP
    thread (:mod:`lab.data.omp`: a 2-thread reader team beside a 2-thread step oversubscribes 2 cores);
    ``reader_single_threaded`` says whether that limit took effect."""

    def __init__(self, loader, depth: int = 2) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"data.prefetch_depth={depth!r} is invalid: must be an integer >= 1")
        self.loader, self.depth = loader, depth
        self.max_queued = 0  # the largest number of batches held at once: the memory the depth costs
        self.reader_single_threaded: bool | None = None  # set by the reader thread once it starts

    @property
    def order(self):  # noqa: ANN201
        return self.loader

    def __iter__(self) -> Iterator[Batch]:
        q: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def put(item: object) -> bool:
            """Block until ``item`` is queued; False if the consumer stopped meanwhile."""
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def fill() -> None:
            self.reader_single_threaded = limit_this_thread(1)
            try:
                for batch in self.loader:
                    if not put(batch):
                        return
                item: object = _DONE
            except BaseException as exc:  # handed to the consumer, which re-raises it
                item = exc
            put(item)

        thread = threading.Thread(target=fill, name="lab-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                self.max_queued = max(self.max_queued, q.qsize())
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join(timeout=5)


class DevicePrefetcher(FollowsOrder):
    """Copies the next batch to the GPU on a side CUDA stream (pinned memory, ``non_blocking``) while the
    current step runs. On a CPU device it is a pass-through. The training loop's own ``.to(device)`` is then
    a no-op, because the tensors are already there."""

    def __init__(self, loader, device: torch.device | str | None) -> None:
        self.loader = loader
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    @property
    def order(self):  # noqa: ANN201
        return self.loader

    def __iter__(self) -> Iterator[Batch]:
        if self.device.type != "cuda":
            yield from self.loader
            return
        stream = torch.cuda.Stream(self.device)

        def send(batch: Batch) -> Batch:
            with torch.cuda.stream(stream):
                return tuple(t.pin_memory().to(self.device, non_blocking=True) for t in batch)

        it = iter(self.loader)
        nxt = next(it, None)
        nxt = send(nxt) if nxt is not None else None
        while nxt is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            cur = nxt
            for t in cur:
                t.record_stream(torch.cuda.current_stream(self.device))
            raw = next(it, None)
            nxt = send(raw) if raw is not None else None
            yield cur
