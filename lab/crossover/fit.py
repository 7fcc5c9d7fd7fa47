"""The crossover model: ``time = overhead + cost x MACs``, fitted per workload x technique x axis, for the
baseline and for the technique; where the two lines cross is the model size from which the technique pays.

Why this model: a step on a CPU costs a fixed part (Python, operator dispatch, allocator, optimizer loop:
one cost per *operator*, whatever its size) plus a part that grows with the arithmetic. A technique that
makes the arithmetic cheaper (bf16 on AMX, int8 VNNI, fewer channels) but adds operators (casts, quantize
/ dequantize, a GradScaler) has a lower slope and a higher intercept, so it loses on small models and wins
from some size on: the crossover, ``(a_tech - a_base) / (b_base - b_tech)`` MACs per sample. The fit is
weighted by 1 / time^2 (relative residuals), because the ladder spans three decades of time and an
unweighted fit would be the largest rung alone. Pure functions: tested on synthetic timings with known
answers (``tests/crossover/test_crossover_fit.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Line:
    """``ms = overhead_ms + ms_per_mmac * MMACs`` (MMACs: millions of MACs per sample at the workload's batch)."""

    overhead_ms: float
    ms_per_mmac: float

    def __call__(self, macs: float | np.ndarray) -> float | np.ndarray:
        return self.overhead_ms + self.ms_per_mmac * np.asarray(macs, dtype=float) / 1e6


def fit_line(macs: Sequence[float], ms: Sequence[float]) -> Line:
    """Weighted least squares of ``ms`` on ``macs`` (weights 1 / ms^2), both coefficients kept >= 0: a
    negative overhead or cost means noise, so that coefficient is set to 0 and the other refitted."""
    x = np.asarray(macs, dtype=float) / 1e6
    y = np.asarray(ms, dtype=float)
    if x.size < 2 or x.size != y.size:
        raise ValueError(f"fit_line needs >= 2 (macs, ms) pairs of equal length, got {x.size} and {y.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(y > 0)):
        raise ValueError("fit_line needs finite MACs and positive finite times")
    w = 1.0 / y**2
    if np.ptp(x) == 0:
        return Line(float(np.sum(w * y) / np.sum(w)), 0.0)
    a_mat = np.stack([np.ones_like(x), x], axis=1) * np.sqrt(w)[:, None]
    (a, b), *_ = np.linalg.lstsq(a_mat, y * np.sqrt(w), rcond=None)
    if b < 0:
        return Line(float(np.sum(w * y) / np.sum(w)), 0.0)
    if a < 0:
        return Line(0.0, float(np.sum(w * x * y) / np.sum(w * x * x)))
    return Line(float(a), float(b))


def crossover_macs(base: Line, tech: Line, min_gain: float = 0.0) -> float | None:
    """MACs per sample from which ``tech`` is predicted at least ``1 + min_gain`` times faster than ``base``
    (``min_gain=0``: where the lines cross): 0.0 when it is at every size, ``None`` when at none. The map
    uses ``min_gain`` = :data:`PAYS_GAIN`: a measured crossover needs the CI's lower bound above 1, which
    a speedup a hair above 1 never shows on a shared machine, so the prediction asks for a real gain too."""
    k = 1.0 + min_gain
    da = k * tech.overhead_ms - base.overhead_ms  # extra fixed cost of the technique
    db = base.ms_per_mmac - k * tech.ms_per_mmac  # arithmetic it saves per MMAC
    if da <= 0 and db >= 0 and not (da == 0 and db == 0):
        return 0.0
    if db <= 0:
        return None
    return float(da / db * 1e6)


#: The gain a prediction must reach to say "pays" (a prediction's margin; ``auto`` precision decides on its own
#: measured CI, ``lab.precision.auto.AUTO_MIN_GAIN``).
PAYS_GAIN = 0.05


def predicted_speedup(base: Line, tech: Line, macs: float) -> float:
    t = float(tech(macs))
    return float(base(macs)) / t if t > 0 else math.inf


def first_paying_rung(ci_lo: Sequence[float | None], ci_hi: Sequence[float | None]) -> int | None:
    """Index of the smallest rung from which the technique pays, measured: its CI lower bound is above 1 and
    no larger rung clearly loses (CI upper bound below 1); ``None`` when no rung qualifies. Rungs without a
    measurement (``None``) neither qualify nor disqualify."""
    n = len(ci_lo)
    for i in range(n):
        if ci_lo[i] is not None and ci_lo[i] > 1.0 and all(
                ci_hi[j] is None or ci_hi[j] >= 1.0 for j in range(i + 1, n)):
            return i
    return None


def rung_of_macs(macs_of_rungs: Sequence[float], macs: float | None) -> int | None:
    """Index of the smallest rung at or above ``macs`` (``len`` when above the ladder; ``None`` for None)."""
    if macs is None:
        return None
    for i, m in enumerate(macs_of_rungs):
        if m >= macs:
            return i
    return len(macs_of_rungs)


def within_one_rung(measured: int | None, predicted: int | None, n_rungs: int) -> bool:
    """Do the measured and predicted crossovers land within one rung? "Never" counts as the rung after the
    top one (a crossover predicted just above the ladder agrees with one measured at its top)."""
    m = n_rungs if measured is None else measured
    p = n_rungs if predicted is None else predicted
    return abs(m - p) <= 1


def params_at(macs_of_rungs: Sequence[float], params_of_rungs: Sequence[float], macs: float | None) -> float | None:
    """Parameters of a model of ``macs`` MACs per sample along the ladder: log-log interpolation between the
    rungs, extrapolated along the nearest segment beyond them (0 for 0, None for None)."""
    if macs is None:
        return None
    if macs <= 0:
        return 0.0
    lx, ly = np.log(np.asarray(macs_of_rungs, dtype=float)), np.log(np.asarray(params_of_rungs, dtype=float))
    order = np.argsort(lx)
    lx, ly = lx[order], ly[order]
    if lx.size == 1:
        return float(params_of_rungs[0])
    t = math.log(macs)
    i = int(np.clip(np.searchsorted(lx, t) - 1, 0, lx.size - 2))
    slope = (ly[i + 1] - ly[i]) / (lx[i + 1] - lx[i]) if lx[i + 1] != lx[i] else 0.0
    return float(math.exp(ly[i] + slope * (t - lx[i])))


def loo_error(macs: Sequence[float], base_ms: Sequence[float], tech_ms: Sequence[float]) -> float | None:
    """Leave-one-out error of the predicted speedup: for each rung, fit both lines on the others and
    compare the predicted speedup there with the measured one; the mean |predicted / measured - 1|.
    ``None`` with fewer than 3 rungs (two points leave nothing to test a line on)."""
    n = len(macs)
    if n < 3:
        return None
    errs = []
    for i in range(n):
        keep = [j for j in range(n) if j != i]
        b = fit_line([macs[j] for j in keep], [base_ms[j] for j in keep])
        t = fit_line([macs[j] for j in keep], [tech_ms[j] for j in keep])
        measured = base_ms[i] / tech_ms[i]
        errs.append(abs(predicted_speedup(b, t, macs[i]) / measured - 1.0))
    return float(np.mean(errs))


# ----------------------------------------------------------------------------------------------- regimes

#: Fixed-overhead share of a step above which the step is dispatch-bound: more than half of it would be
#: there for a model with no arithmetic at all.
DISPATCH_SHARE = 0.5
#: MACs per byte of weight traffic below which a step is memory-bound on a CPU: one AVX-512 core does
#: ~50-80 G fp32 MACs/s against ~5-10 GB/s of DRAM bandwidth per core, a balance of ~8 MACs per byte.
RIDGE_MACS_PER_BYTE = 8.0
#: Bytes of weight traffic per parameter: inference reads each weight (fp32, 4 B); a training step with
#: Adam reads and writes weights, gradients and two moment tensors (~4 x 4 B read + 3 x 4 B written).
BYTES_PER_PARAM = {"inference": 4.0, "train_step": 28.0}


def regime(base: Line, base_ms: float, macs_per_sample: float, batch_size: int, weight_params: int,
           axis: str) -> tuple[str, str]:
    """(tag, evidence) of one rung's baseline step: ``dispatch-bound`` when the fit's fixed overhead is at
    least half the measured step; otherwise ``memory-bound`` when its arithmetic intensity (MACs per byte of
    weight traffic) is below the CPU's balance, else ``compute-bound``."""
    share = min(1.0, base.overhead_ms / base_ms) if base_ms > 0 else 1.0
    macs_step = macs_per_sample * batch_size * (3.0 if axis == "train_step" else 1.0)
    bytes_step = max(1.0, weight_params * BYTES_PER_PARAM[axis])
    intensity = macs_step / bytes_step
    evidence = (f"fixed overhead {base.overhead_ms:.3g} ms = {share:.0%} of the {base_ms:.3g} ms step; "
                f"{intensity:.3g} MACs per byte of weight traffic")
    if share >= DISPATCH_SHARE:
        return "dispatch-bound", evidence
    if intensity < RIDGE_MACS_PER_BYTE:
        return "memory-bound", evidence
    return "compute-bound", evidence
