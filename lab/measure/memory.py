"""Memory: process RSS, peak since start, and a sampler for the peak of one region (the training loop).

Units are in the names: ``*_mb`` mebibytes (2**20 bytes).
"""

from __future__ import annotations

import functools
import resource
import sys
from typing import Any

import torch

MIB = float(2**20)


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


@functools.lru_cache(maxsize=1)
def _process() -> Any:
    import psutil  # keep import cost off module import

    return psutil.Process()


def rss_mb() -> float:
    """Current resident set size of this process (one /proc read, ~10 us)."""
    return _process().memory_info().rss / MIB


def peak_memory_mb(device: str | torch.device = "cpu") -> float:
    """High-water mark since process start (CPU: ru_maxrss) or since the last
    ``torch.cuda.reset_peak_memory_stats`` (CUDA: bytes allocated by tensors, not the caching pool)."""
    if _is_cuda(device):
        return torch.cuda.max_memory_allocated(torch.device(device)) / MIB
    # ru_maxrss is in KiB on Linux, bytes on macOS.
    scale = 1.0 if sys.platform == "darwin" else 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / MIB


class MemorySampler:
    """Peak memory during a region (e.g. the training loop), from construction or the last ``start()``.

    CPU: the kernel only keeps a lifetime RSS high-water mark, which one earlier big run would pin, so
    we sample RSS ourselves (call ``sample()`` every ~10 steps; each call is one /proc read). The peak is
    therefore a lower bound between samples. CUDA: the allocator tracks the exact peak for us, so
    ``sample()`` is cheap and ``start()`` just resets the counter.
    """

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.kind = "cuda" if self.device.type == "cuda" else "rss"
        self.baseline_mb = 0.0
        self._peak_mb = 0.0
        self.start()

    def start(self) -> MemorySampler:
        """(Re)start the region: record the baseline and reset the peak to it."""
        if self.kind == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_mb = torch.cuda.memory_allocated(self.device) / MIB
        else:
            self.baseline_mb = rss_mb()
        self._peak_mb = self.baseline_mb
        return self

    def sample(self) -> float:
        """Read current usage, update the peak and return the current value in MB."""
        if self.kind == "cuda":
            return torch.cuda.memory_allocated(self.device) / MIB
        now = rss_mb()
        if now > self._peak_mb:
            self._peak_mb = now
        return now

    def peak_mb(self) -> float:
        """Peak since ``start()`` in MB (absolute, baseline included; subtract ``baseline_mb`` for the
        region's own growth)."""
        if self.kind == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / MIB
        return self._peak_mb

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.sample()

__all__ = [
    "MemorySampler", "MIB", "peak_memory_mb", "rss_mb",
]
