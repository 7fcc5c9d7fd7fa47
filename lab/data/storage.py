"""Emulated remote storage: real file reads plus a per-read latency and a bandwidth cap.

Why emulate: on a laptop or CI box the files sit on local disk and, after the first read, in the page cache,
so reading a shard costs microseconds and no loader choice matters. Training clusters read from a network
file system or an object store, where every request pays a round trip and a throughput cap. The store below
keeps the bytes real (the file is read and returned) and sleeps for whatever the preset's cost model says the
read should have taken beyond what it actually took. Sleeping releases the GIL, like a real socket wait, so
threads and worker processes overlap these waits exactly as they would overlap network I/O.
"""

from __future__ import annotations

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


def pay(cost: StoragePreset, nbytes: int, started_s: float) -> None:
    """Sleep until ``cost.read_cost_s(nbytes)`` has passed since ``started_s`` (perf_counter seconds)."""
    remaining_s = cost.read_cost_s(nbytes) - (time.perf_counter() - started_s)
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
