"""Which samples each (rank, worker) reads: contiguous, strided and hash-by-id sharding, plus a skew report.

Why it matters: every sample must be seen exactly once per epoch whatever the world size and worker count,
and a resumed run must continue where it stopped. *How* samples are split matters as much: a click log is
stored in time (or user) order, so a contiguous split hands each rank a different week or a different set of
users, and each rank then trains on a skewed distribution. The seed splits with ``data[i::n]`` (strided);
hashing the row id spreads any ordering evenly and does not depend on the number of rows.
"""

from __future__ import annotations

import numpy as np
import torch

STRATEGIES = ("contiguous", "strided", "hash")


def _int(name: str, value: object, lo: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (lo is not None and value < lo):
        raise ValueError(f"{name}={value!r} is invalid: must be an integer" + (f" >= {lo}" if lo is not None else ""))


def _check(world_size: int, rank: int, num_workers: int, worker: int, strategy: str) -> None:
    for name, value in (("world_size", world_size), ("rank", rank), ("num_workers", num_workers), ("worker", worker)):
        _int(name, value)  # integers; their ranges are checked below
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is invalid: allowed: {', '.join(STRATEGIES)}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is invalid: must be in 0..world_size-1 (world_size={world_size})")
    if num_workers < 0 or not 0 <= worker < max(num_workers, 1):
        raise ValueError(f"worker={worker!r} is invalid: must be in 0..max(num_workers,1)-1 "
                         f"(num_workers={num_workers})")


def _mix(ids: np.ndarray, seed: int) -> np.ndarray:
    z = ids.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def part_of(n: int, parts: int, strategy: str, *, ids: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
    """For each of ``n`` samples (or ``ids``), the part 0..parts-1 that owns it."""
    _int("parts", parts, 1)
    _int("n", n, 0)
    if strategy == "contiguous":
        return (np.arange(n) * parts) // n
    if strategy == "strided":
        return np.arange(n) % parts
    if strategy == "hash":
        ids = np.arange(n) if ids is None else np.asarray(ids)
        with np.errstate(over="ignore"):
            return (_mix(ids, seed) % np.uint64(parts)).astype(np.int64)
    raise ValueError(f"strategy={strategy!r} is invalid: allowed: {', '.join(STRATEGIES)}")


def shard_indices(n: int, *, world_size: int = 1, rank: int = 0, num_workers: int = 0, worker: int = 0,
                  strategy: str = "strided", ids: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
    """Indices (in storage order) that (rank, worker) owns. Parts are numbered rank-major:
    ``part = rank * max(num_workers, 1) + worker``, so ranks × workers partition ``range(n)`` exactly."""
    _check(world_size, rank, num_workers, worker, strategy)
    per_rank = max(num_workers, 1)
    parts = world_size * per_rank
    if n < parts and strategy != "hash":
        raise ValueError(f"world_size*workers={parts} is invalid: more parts than samples ({n})")
    owner = part_of(n, parts, strategy, ids=ids, seed=seed)
    return np.flatnonzero(owner == rank * per_rank + worker)


def epoch_order(indices: np.ndarray, *, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """A deterministic per-(seed, epoch) permutation of a part's indices."""
    if not shuffle:
        return indices
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return indices[torch.randperm(len(indices), generator=g).numpy()]


def resume(order: np.ndarray, batch_size: int, batches_done: int) -> np.ndarray:
    """What is left of an epoch after ``batches_done`` batches: the same order, without repeats or gaps."""
    _int("batch_size", batch_size, 1)
    _int("batches_done", batches_done, 0)
    if batches_done < 0 or batches_done * batch_size > len(order):
        raise ValueError(f"batches_done={batches_done!r} is invalid: must be in 0..{len(order) // batch_size}")
    return order[batches_done * batch_size:]


def skew_report(labels: np.ndarray, features: np.ndarray, parts: int, strategy: str, *,
                ids: np.ndarray | None = None, seed: int = 0) -> dict:
    """Per-part label rate and feature means, and two divergence figures against the whole log:
    ``label_rate_spread`` (max - min label rate across parts) and ``max_feature_shift_sd`` (largest
    |part mean - global mean| in global standard deviations over all features). A hash split should show
    only sampling noise; a contiguous split of a sorted log shows the sort key's drift."""
    labels, features = np.asarray(labels, dtype=np.float64), np.asarray(features, dtype=np.float64)
    owner = part_of(len(labels), parts, strategy, ids=ids, seed=seed)
    mu, sd = features.mean(0), features.std(0) + 1e-12
    rates, shifts, sizes = [], [], []
    for p in range(parts):
        m = owner == p
        sizes.append(int(m.sum()))
        rates.append(float(labels[m].mean()) if m.any() else float("nan"))
        shifts.append(float(np.max(np.abs(features[m].mean(0) - mu) / sd)) if m.any() else float("nan"))
    noise = float(np.sqrt(labels.mean() * (1 - labels.mean()) / max(min(sizes), 1)))
    return {"strategy": strategy, "parts": parts, "rows": sizes, "label_rate": rates,
            "label_rate_spread": float(np.nanmax(rates) - np.nanmin(rates)), "label_rate_noise_sd": noise,
            "feature_shift_sd": shifts, "max_feature_shift_sd": float(np.nanmax(shifts))}
