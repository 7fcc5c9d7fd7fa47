"""Statistics for honest comparisons: medians, spreads, bootstrap CIs of a median and of a ratio of medians.

Why medians and a bootstrap: step times on a shared machine have heavy right tails (another process
wakes up), so a mean is dragged by outliers and a normal-theory interval is wrong. Re-exported by
:mod:`lab.measure`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

# ------------------------------------------------------------------------------------------ statistics


def as_float(x: Any) -> float:
    """``x`` as a float, NaN where it is not a number (``None``, text, a table's empty cell): the readers of
    stored tables format what is there and leave a gap, never raise."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _as_array(xs: Iterable[float], name: str = "samples") -> np.ndarray:
    arr = np.asarray(list(xs) if not isinstance(xs, np.ndarray) else xs, dtype=float).ravel()
    if arr.size == 0:
        raise ValueError(f"{name} is empty; need at least one sample")
    return arr


def median(xs: Iterable[float]) -> float:
    """Median: robust to the stragglers a shared machine produces, unlike the mean."""
    return float(np.median(_as_array(xs)))


def spread(xs: Iterable[float]) -> float:
    """Interquartile range (same units as ``xs``): the spread to quote next to a median."""
    q1, q3 = np.percentile(_as_array(xs), [25, 75])
    return float(q3 - q1)


def relative_spread(xs: Iterable[float]) -> float:
    """IQR / median: above ~0.2 the machine was too noisy to trust small speedups."""
    arr = _as_array(xs)
    med = float(np.median(arr))
    return float("inf") if med == 0 else spread(arr) / abs(med)


def _boot_stat(
    arr: np.ndarray, stat: Callable[..., Any], n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """``n_boot`` resampled statistics, vectorised in chunks of ~4M values to bound memory."""
    n = arr.size
    rows = max(1, 4_000_000 // n)
    out = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        sample = arr[rng.integers(0, n, size=(stop - start, n))]
        try:
            out[start:stop] = stat(sample, axis=1)
        except TypeError:  # statistic without an axis argument
            out[start:stop] = [stat(row) for row in sample]
    return out


def _check_ci(ci: float, n_boot: int) -> None:
    if not 0 < ci < 1:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")


def bootstrap_ci(
    samples: Iterable[float],
    stat: Callable[..., Any] = np.median,
    *,
    n_boot: int = 2000,
    ci: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(estimate, lo, hi): percentile bootstrap CI of ``stat`` (default median). Seeded, so the same
    samples always give the same interval."""
    _check_ci(ci, n_boot)
    arr = _as_array(samples)
    boots = _boot_stat(arr, stat, n_boot, np.random.default_rng(seed))
    lo, hi = np.percentile(boots, [100 * (1 - ci) / 2, 100 * (1 + ci) / 2])
    return float(stat(arr)), float(lo), float(hi)


def bootstrap_ratio_ci(
    numer_samples: Iterable[float],
    denom_samples: Iterable[float],
    *,
    n_boot: int = 2000,
    ci: float = 0.95,
    seed: int = 0,
    paired: bool = False,
) -> tuple[float, float, float]:
    """(ratio, lo, hi) for median(numer) / median(denom). Speedup = bootstrap_ratio_ci(baseline_times,
    variant_times). By default both sets are resampled independently (they come from different runs).

    ``paired``: sample ``i`` of both was taken in the same interleaved round (``lab.measure.interleaved_ms``), and
    the rounds are resampled *together*, so what moved a whole round (a shared box's load, a frequency step) moves
    both medians of a resample and cancels in their ratio; the estimate is the same, only the interval differs.
    On the AMD EPYC full map the independent resampling read bf16 at mlp xl as 2.0x [0.42, 4.5] over 5 rounds whose
    fp32 step itself moved 2x from round to round."""
    _check_ci(ci, n_boot)
    num = _as_array(numer_samples, "numer_samples")
    den = _as_array(denom_samples, "denom_samples")
    rng = np.random.default_rng(seed)
    if paired:
        if num.size != den.size:
            raise ValueError(f"paired samples need one of each per round: {num.size} vs {den.size}")
        idx = rng.integers(0, num.size, size=(n_boot, num.size))
        bn, bd = np.median(num[idx], axis=1), np.median(den[idx], axis=1)
    else:
        bn = _boot_stat(num, np.median, n_boot, rng)
        bd = _boot_stat(den, np.median, n_boot, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = bn / bd
        est = float(np.median(num) / np.median(den)) if np.median(den) != 0 else float("inf")
    lo, hi = np.percentile(ratios, [100 * (1 - ci) / 2, 100 * (1 + ci) / 2])
    return est, float(lo), float(hi)


def paired_ratio_ci(numer_samples: Iterable[float], denom_samples: Iterable[float],
                    **kw: Any) -> tuple[float, float, float]:
    """:func:`bootstrap_ratio_ci` with ``paired=True``: the rounds of one interleaved loop resampled together."""
    return bootstrap_ratio_ci(numer_samples, denom_samples, paired=True, **kw)


#: Fewer paired rounds than this and the interval falls back to independent resampling.
MIN_PAIRED_ROUNDS = 3


def rounds_ratio_ci(base: Sequence[float], arm: Sequence[float], **kw: Any) -> tuple[float, float, float]:
    """Speedup of ``arm`` over ``base`` from samples of one interleaved loop, sample ``i`` of each taken in round
    ``i`` (an arm may have fewer rounds than the base: an arm dropped later, or extra rounds given to some arms
    only, add at the end): :func:`paired_ratio_ci` over the rounds both have (the ratio of their medians, with
    the rounds resampled together), once there are :data:`MIN_PAIRED_ROUNDS`; else :func:`bootstrap_ratio_ci`."""
    n = min(len(base), len(arm))
    if n < MIN_PAIRED_ROUNDS:
        return bootstrap_ratio_ci(base, arm, **kw)
    return paired_ratio_ci(list(base)[:n], list(arm)[:n], **kw)


#: Two-sided 95 % Student-t critical values by degrees of freedom (beyond the table: the normal's 1.96 is
#: within 4 % from 30 on). A table, not scipy: scipy is not a dependency of the lab.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(dof: int) -> float:
    """The 95 % two-sided Student-t critical value at ``dof`` (the nearest tabled one below, conservative)."""
    if dof < 1:
        raise ValueError(f"dof={dof}: a t interval needs at least 2 values")
    return T975[max(k for k in T975 if k <= dof)] if dof <= 30 else 1.96


def mean_t_ci(values: Iterable[float]) -> tuple[float, float, float]:
    """Mean with its Student-t 95 % CI: for a handful of independent values, one per seed, where a bootstrap
    of three points would claim a precision it does not have. NaN bounds for a single value."""
    arr = np.asarray(list(values), dtype=float)
    if not len(arr):
        return float("nan"), float("nan"), float("nan")
    mean = float(arr.mean())
    if len(arr) < 2:
        return mean, float("nan"), float("nan")
    half = t975(len(arr) - 1) * float(arr.std(ddof=1)) / float(np.sqrt(len(arr)))
    return mean, mean - half, mean + half


__all__ = [
    "bootstrap_ci", "bootstrap_ratio_ci", "mean_t_ci", "median", "MIN_PAIRED_ROUNDS", "paired_ratio_ci",
    "relative_spread", "rounds_ratio_ci", "spread", "t975",
]
