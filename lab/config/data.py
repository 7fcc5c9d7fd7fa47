"""How batches reach the model: the data-loading family's config (``RunConfig.data``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lab.config.checks import check_bool, check_choice, check_int, fail
from lab.config.family import _Family
from lab.registry import LOADERS, STORAGES


@dataclass(frozen=True, kw_only=True)
class DataConfig(_Family):
    """How batches reach the model. ``loader`` names a builder in :data:`lab.registry.LOADERS` (``memory``
    slices in-memory tensors, the upper bound a loader can hit; ``dataloader`` is ``torch.utils.data.DataLoader``;
    the others are the data-loading lab's, notebook 01); ``storage`` a preset in :data:`lab.registry.STORAGES`."""

    family: ClassVar[str] = "data"
    SWITCH: ClassVar[str] = "data.loader other than 'memory' (--loader)"
    OFF_OK: ClassVar[tuple[str, ...]] = ("shuffle", "drop_last", "source", "ideal_replay")
    SOURCES: ClassVar[tuple[str, ...]] = ("memory", "files")
    ALLOWED: ClassVar[dict[str, tuple[str, ...]]] = {"source": SOURCES}
    HELP: ClassVar[dict[str, str]] = {
        "loader": "how batches reach the model: memory slices in-memory tensors (the upper bound a loader can hit), "
                  "dataloader is torch's DataLoader, the others are the data-loading lab's (notebook 01)",
        "num_workers": "DataLoader worker processes (loader dataloader only; 0: read in the main process)",
        "prefetch_factor": "batches each DataLoader worker loads ahead (needs --num-workers > 0; none: torch's "
                           "default)",
        "pin_memory": "DataLoader copies batches into pinned memory, for faster host-to-GPU copies (loader "
                      "dataloader only)",
        "persistent_workers": "keep the DataLoader's workers alive between epochs (needs --num-workers > 0)",
        "shuffle": "shuffle the training split every epoch",
        "drop_last": "drop each epoch's last, incomplete batch",
        "storage": "emulated storage preset: every read pays its latency and bandwidth cap (none: in memory, no "
                   "cost; needs a loader other than memory)",
        "prefetch_depth": "batches the thread prefetcher may hold ahead of the training loop (loader thread or "
                          "device_prefetch)",
        "prefetch_readers": "reads the thread prefetcher keeps in flight at once, in threads, to hide read latency "
                            "(loader thread or device_prefetch)",
        "source": "where the training split is read from: memory, or files (written once to shard files and read "
                  "back; needs a loader that reads files)",
        "ideal_replay": "also replay cached batches through the same step: the ideal-loader bound for the data wait",
    }

    loader: str = "memory"
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    shuffle: bool = True
    drop_last: bool = True
    storage: str = "none"  # emulated storage preset (lab.registry.STORAGES); "none" = in-memory, no cost
    prefetch_depth: int = 2  # batches the thread prefetcher may hold ahead of the training loop
    prefetch_readers: int = 1  # the thread prefetcher's reads in flight at once (threads; hides read latency)
    source: str = "memory"  # "files": the training split written once to shard files and read back
    ideal_replay: bool = False  # also replay cached batches through the same step: the ideal-loader bound

    def __post_init__(self) -> None:
        check_choice(self._name("source"), self.source, self.SOURCES)
        check_bool(self._name("ideal_replay"), self.ideal_replay)
        check_choice(self._name("loader"), self.loader, LOADERS.names())
        check_choice(self._name("storage"), self.storage, STORAGES.names())
        check_int(self._name("prefetch_depth"), self.prefetch_depth, lo=1, hi=1024)
        check_int(self._name("prefetch_readers"), self.prefetch_readers, lo=1, hi=64)
        check_int(self._name("num_workers"), self.num_workers, lo=0, hi=64)
        check_int(self._name("prefetch_factor"), self.prefetch_factor, lo=1, hi=1024, optional=True)
        for attr in ("pin_memory", "persistent_workers", "shuffle", "drop_last"):
            check_bool(self._name(attr), getattr(self, attr))
        # These mirror DataLoader's own rules, but fail at config time with the field's name.
        if self.prefetch_factor is not None and self.num_workers == 0:
            fail(self._name("prefetch_factor"), self.prefetch_factor, "needs num_workers > 0")
        if self.persistent_workers and self.num_workers == 0:
            fail(self._name("persistent_workers"), True, "needs num_workers > 0")
        if self.loader != "memory" and self.num_workers and not LOADERS.get(self.loader).worker_processes:
            fail(self._name("num_workers"), self.num_workers,
                  f"loader={self.loader!r} reads in the main process; worker processes need loader='dataloader'")
        if self.loader == "memory" and self.storage != "none":
            fail(self._name("storage"), self.storage, "the in-memory loader is the no-storage limit; use 'naive'")
        if self.loader == "memory" and (self.num_workers or self.pin_memory):
            fail(self._name("loader"), self.loader,
                  "the in-memory loader has no workers or pinned memory; use loader='dataloader'")
        if self.source == "files" and self.loader == "memory":
            fail(self._name("source"), self.source, "needs a loader that reads files: --loader naive, thread, "
                 "device_prefetch or dataloader (the in-memory loader reads none)")
        spec = LOADERS.get(self.loader)
        if self.prefetch_depth != 2 and not spec.prefetch_depth:
            fail(self._name("prefetch_depth"), self.prefetch_depth,
                 f"loader={self.loader!r} holds no prefetch queue; it needs loader='thread' or 'device_prefetch'")
        if self.prefetch_readers != 1 and not spec.prefetch_depth:
            fail(self._name("prefetch_readers"), self.prefetch_readers,
                 f"loader={self.loader!r} has no prefetch reader; it needs loader='thread' or 'device_prefetch' "
                 "(DataLoader reads in parallel with num_workers)")
        if self.prefetch_readers != 1 and self.source == "files":
            fail(self._name("prefetch_readers"), self.prefetch_readers,
                 "is in-memory batches only for now: the file reader keeps one shard cache and one byte count per "
                 "process, which concurrent reads would share; with data.source='files' use loader='dataloader' "
                 "with num_workers")
        if self.pin_memory and not spec.worker_processes:
            fail(self._name("pin_memory"), True, f"loader={self.loader!r} does not pin; use loader='dataloader'")
        self._refuse_when_off()

    @property
    def enabled(self) -> bool:
        return self.loader != "memory" or self.storage != "none"
