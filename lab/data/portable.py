"""Data loading as plain PyTorch (``python -m lab recipe``, :mod:`lab.portable`): the loader ``cfg.data`` names,
over the user's own ``Dataset``. ``dataloader`` is ``torch.utils.data.DataLoader`` with the config's workers, pinned
memory, persistent workers and prefetch factor; ``thread`` is a bounded background-thread prefetcher written out
(:class:`lab.data.ThreadPrefetcher` over :func:`lab.data.prefetch.ordered_reads`): the same batches as a
``DataLoader``, read ahead by threads while the step computes, with ``data.prefetch_readers`` reads in flight.

What is the lab's own and stays out: the emulated storage (``data.storage``: the cost of where the data lives,
which the user's real storage replaces), the shard files (``data.source='files'``: the user's Dataset reads the
user's files) and the in-memory slicing of the lab's baseline loader (a ``DataLoader`` gathers rows one by one).
"""

from __future__ import annotations

from lab.config import RunConfig
from lab.result import RunResult
from lab.technique import NotPortable, Portable

#: The thread prefetcher, written out: DataLoader's keywords plus ``depth`` and ``readers``.
THREAD_PREFETCHER = '''\
class ThreadPrefetcher:
    """DataLoader's batches (same keywords) read ahead by background threads: at most `depth` batches wait in a
    bounded queue while the step computes (unbounded, the reader would run ahead until memory is gone), with
    `readers` reads in flight at once. Threads, not processes: a read waiting on I/O releases the GIL."""

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, drop_last=False, depth=2, readers=1):
        self.dataset, self.depth, self.readers = dataset, depth, readers
        self.sampler = sampler if sampler is not None else (
            RandomSampler(dataset) if shuffle else SequentialSampler(dataset))
        self.batches = BatchSampler(self.sampler, batch_size, drop_last)

    def __len__(self):
        return len(self.batches)

    def read(self, indices):
        return default_collate([self.dataset[i] for i in indices])

    def __iter__(self):
        ready, stop = queue.Queue(maxsize=self.depth), threading.Event()

        def put(item):
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def fill():
            try:
                with ThreadPoolExecutor(self.readers) as pool:
                    pending = collections.deque()
                    for indices in self.batches:
                        pending.append(pool.submit(self.read, indices))
                        if len(pending) >= self.readers and not put(pending.popleft().result()):
                            return
                    while pending:
                        if not put(pending.popleft().result()):
                            return
                put(None)
            except BaseException as exc:  # handed to the training loop, which raises it
                put(exc)

        reader = threading.Thread(target=fill, daemon=True)
        reader.start()
        try:
            while (item := ready.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            reader.join(timeout=5)'''

THREAD_IMPORTS = ("import collections", "import queue", "import threading",
                  "from concurrent.futures import ThreadPoolExecutor",
                  "from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, default_collate")


def portable(cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
    """The loader ``cfg.data`` asks for, as DataLoader keywords or the thread prefetcher."""
    dc = cfg.data
    notes = []
    if dc.storage != "none":
        notes.append(f"data.storage={dc.storage!r} is the lab's emulation of where the data lives (each read pays "
                     "its latency and bandwidth): your Dataset's real reads replace it")
    if dc.source == "files":
        notes.append("data.source='files': the lab wrote the split to shard files and read them back; your "
                     "Dataset reads your files")
    kwargs: list[tuple[str, str]] = [] if dc.drop_last else [("drop_last", "False")]
    if dc.loader in ("memory", "naive"):
        if not kwargs and not notes:
            return None
        return Portable(comment="torch DataLoader, batches read in the training process", loader_kwargs=tuple(kwargs),
                        notes=tuple(notes))
    if dc.loader == "dataloader":
        if dc.num_workers:
            kwargs.append(("num_workers", str(dc.num_workers)))
        for name, value, default in (("pin_memory", dc.pin_memory, False),
                                     ("persistent_workers", dc.persistent_workers, False),
                                     ("prefetch_factor", dc.prefetch_factor, None)):
            if value != default:
                kwargs.append((name, repr(value)))
        workers = (f"{dc.num_workers} worker process{'es' if dc.num_workers > 1 else ''} (they share the cores "
                   "with compute)" if dc.num_workers else "no worker process")
        return Portable(comment=f"torch DataLoader with {workers}"
                                + (", pinned memory" if dc.pin_memory else ""),
                        loader_kwargs=tuple(kwargs), notes=tuple(notes))
    if dc.loader == "thread":
        kwargs += [("depth", str(dc.prefetch_depth)), ("readers", str(dc.prefetch_readers))]
        reads = f", {dc.prefetch_readers} reads in flight" if dc.prefetch_readers > 1 else ""
        return Portable(comment=f"a background-thread prefetcher: up to {dc.prefetch_depth} batches ready ahead of "
                                f"the step{reads}", imports=THREAD_IMPORTS, helpers=(THREAD_PREFETCHER,),
                        loader_class="ThreadPrefetcher", loader_kwargs=tuple(kwargs), notes=tuple(notes))
    raise NotPortable(f"data.loader={dc.loader!r}: the lab's {dc.loader} loader is not written out by the recipe "
                      "(written out: dataloader, thread)")


__all__ = ["THREAD_PREFETCHER", "portable"]
