"""Emulated remote storage: real file reads plus a per-read latency and a bandwidth cap.

Why emulate: on a laptop or CI box the files sit on local disk and, after the first read, in the page cache,
so reading a shard costs microseconds and no loader choice matters. Training clusters read from a network
file system or an object store, where every request pays a round trip and a throughput cap. The store below
keeps the bytes real (the file is read and returned) and sleeps for whatever the preset's cost model says the
read should have taken beyond what it actually took. Sleeping releases the GIL, like a real socket wait, so
threads and worker processes overlap these waits as they would overlap network I/O.

What overlaps and what does not (:func:`pay`): a request's *latency* (the round trip, the first byte) overlaps
with other requests in flight, which is why several reads in flight hide it; its *transfer* goes over the
storage's one link at ``bandwidth_mb_s``, one transfer after another, so reads in flight never add bandwidth.
The link is shared by the threads of one process; DataLoader worker processes each get their own (an emulated
store cannot see another process's reads), which flatters workers where transfers, not latency, dominate.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from lab.registry import STORAGES


@dataclass(frozen=True)
class StoragePreset:
    """Cost of one read: ``latency_ms`` per request plus ``nbytes / bandwidth_mb_s``."""

    name: str
    latency_ms: float
    bandwidth_mb_s: float

    def __post_init__(self) -> None:
        if not self.latency_ms >= 0:
            raise ValueError(f"storage.latency_ms={self.latency_ms!r} is invalid: must be >= 0")
        if not self.bandwidth_mb_s > 0:
            raise ValueError(f"storage.bandwidth_mb_s={self.bandwidth_mb_s!r} is invalid: must be > 0")

    def read_cost_s(self, nbytes: int) -> float:
        """Seconds one read of ``nbytes`` should take on this storage."""
        return self.latency_ms / 1e3 + nbytes / (self.bandwidth_mb_s * 1e6)


# Orders of magnitude, not vendor figures: NVMe ~0.1 ms / 2 GB/s; a busy NFS ~5 ms / 100 MB/s; S3-like
# first-byte ~20 ms / 80 MB/s per stream. The ratios between them are what the lab reproduces.
for _preset in (StoragePreset("none", 0.0, 1e12), StoragePreset("local_ssd", 0.1, 2000.0),
                StoragePreset("network_fs", 5.0, 100.0), StoragePreset("object_store", 20.0, 80.0)):
    STORAGES.register(_preset.name, _preset, overwrite=True)  # overwrite: importlib.reload stays idempotent
del _preset
#: The presets by name (the registry that ``data.storage`` is validated against).
PRESETS = STORAGES


def preset(name_or_preset: str | StoragePreset) -> StoragePreset:
    """Look a preset up by name (a ValueError lists the allowed names)."""
    if isinstance(name_or_preset, StoragePreset):
        return name_or_preset
    return STORAGES.get(name_or_preset)


class _Link:
    """One storage preset's link in this process: when its last reserved transfer ends."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free_at = 0.0  # perf_counter seconds


_LINKS: dict[str, _Link] = {}
_LINKS_LOCK = threading.Lock()


def _link(cost: StoragePreset) -> _Link:
    with _LINKS_LOCK:
        return _LINKS.setdefault(cost.name, _Link())


def read_done_s(cost: StoragePreset, nbytes: int, started_s: float) -> float:
    """When (perf_counter seconds) a read of ``nbytes`` started at ``started_s`` completes: its latency first,
    then its transfer once the preset's link is free (reserved here). One reader at a time: ``started_s +
    cost.read_cost_s(nbytes)``, exactly; several in flight: their latencies overlap, their transfers queue."""
    link = _link(cost)
    with link.lock:
        begin = max(started_s + cost.latency_ms / 1e3, link.free_at)
        link.free_at = begin + nbytes / (cost.bandwidth_mb_s * 1e6)
        return link.free_at


def pay(cost: StoragePreset, nbytes: int, started_s: float) -> None:
    """Sleep until the read of ``nbytes`` started at ``started_s`` (perf_counter seconds) would have completed
    on ``cost``'s storage (:func:`read_done_s`), beyond what the real read already took."""
    remaining_s = read_done_s(cost, nbytes, started_s) - time.perf_counter()
    if remaining_s > 0:
        time.sleep(remaining_s)


class EmulatedStore:
    """Reads files under ``root`` at the speed of ``storage``; counts requests and bytes for the stall
    analysis."""

    def __init__(self, root: str | Path, storage: str | StoragePreset = "network_fs") -> None:
        self.root = Path(root)
        self.cost = preset(storage)
        self.reads = 0
        self.bytes_read = 0

    def read_bytes(self, name: str) -> bytes:
        started_s = time.perf_counter()
        data = (self.root / name).read_bytes()
        pay(self.cost, len(data), started_s)
        self.reads += 1
        self.bytes_read += len(data)
        return data
