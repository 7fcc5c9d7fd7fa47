"""The arithmetic every prediction shares: Amdahl's law over op classes, its Monte-Carlo interval, and the
two records it reads and writes (:class:`Rates` in, :class:`Prediction` out).

Kept apart from :mod:`lab.doctor.predict` (one model per technique) so that each stays short and a new
technique's model imports only this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lab.doctor.compile_rate import CompileCost
from lab.doctor.rates import Rate

#: Classes that forward + backward run (what fast kernels or compile can touch); the rest is data, optimizer, comm.
COMPUTE = ("matmul", "embedding", "recurrent", "norm", "elementwise", "reduction", "other", "overhead")
N_SAMPLES = 2000


@dataclass
class Prediction:
    """One technique's predicted speedup on one axis (``train_step`` or ``inference``)."""

    technique: str
    axis: str
    speedup: float
    lo: float
    hi: float
    reason: str
    sources: list[str] = field(default_factory=list)
    #: the interval from the rates alone, before :mod:`lab.doctor.calibration` widened ``lo``/``hi`` to the
    #: model's own error (``None``: not calibrated) and the sentence that says by how much
    model_lo: float | None = None
    model_hi: float | None = None
    band: str = ""
    #: set by :func:`lab.doctor.risk.prescribe`: the one-off seconds charged (compile, ``auto``'s probe), the
    #: speedup over the run's length with them and its interval, and whether it is prescribed (its run interval
    #: is faster than the baseline with P >= 0.8 and a gain beyond the A/A noise); ``None`` before that
    one_off_s: float = 0.0
    run_speedup: float | None = None
    run_lo: float | None = None
    run_hi: float | None = None
    prescribed: bool | None = None
    #: set by the same: the probability the pick is faster than the baseline over the run, and the expected share
    #: of the run's time it saves (:func:`lab.doctor.risk.decide`)
    p_faster: float | None = None
    expected_saving: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"technique": self.technique, "axis": self.axis, "speedup": self.speedup, "lo": self.lo,
                "hi": self.hi, "reason": self.reason, "sources": list(self.sources), "model_lo": self.model_lo,
                "model_hi": self.model_hi, "band": self.band, "one_off_s": self.one_off_s,
                "run_speedup": self.run_speedup, "run_lo": self.run_lo, "run_hi": self.run_hi,
                "prescribed": self.prescribed, "p_faster": self.p_faster,
                "expected_saving": self.expected_saving}


@dataclass
class Rates:
    """Everything the models read: per-(technique, class) rates, calibrated or from the map, and facts."""

    precision: dict[tuple[str, str], Rate] = field(default_factory=dict)  # (dtype, linear|conv|rnn)
    model_precision: dict[str, Rate] = field(default_factory=dict)  # dtype -> this model's forward + backward
    thread_loader_ms: Rate | None = None  # ms a thread-prefetched batch adds beside forward + backward (not a ratio)
    thread_readers_ms: dict[int, Rate] = field(default_factory=dict)  # the same with N reads in flight (N > 1)
    worker_loader_ms: dict[int, Rate] = field(default_factory=dict)  # the same for N DataLoader worker processes
    fused_optimizer: Rate | None = None
    grad_scaler: Rate | None = None  # fp16's GradScaler as a rate of the optimizer class (< 1: slower)
    dynamic_int8: Rate | None = None
    fast_kernels: Rate | None = None
    checkpoint: Rate | None = None  # this model's forward + backward, plain vs its blocks checkpointed
    tiny_op_us: float = 5.0
    crossover: dict[tuple[str, str], Rate] = field(default_factory=dict)  # (technique, axis) from the map
    batch_bytes: int = 0
    compile: CompileCost | None = None  # torch.compile's saving per fusable op and price per call, measured here
    steps: int = 0  # the steps the run trains (compile's time is amortised over them)
    model_compile: Rate | None = None  # this model's forward + backward, eager vs compiled (when the user paid for it)
    model_compile_s: float = 0.0  # what that compile took (its first call)
    attention: int = 0  # attention modules in the model (compile's structural prior reads it)
    macs_per_sample: float = 0.0  # the model's forward MACs per sample (the same prior: how small its blocks are)


def _sample(rate: Rate, n: int, rng: np.random.Generator) -> np.ndarray:
    z = rng.standard_normal(n)
    up = (np.log(rate.hi) - np.log(rate.value)) / 1.96
    down = (np.log(rate.value) - np.log(rate.lo)) / 1.96
    return np.exp(np.log(rate.value) + np.where(z > 0, z * up, z * down))


def monte_carlo(time_fraction: Callable[[Mapping[str, Any]], Any], params: Mapping[str, Rate],
                seed: int = 0) -> tuple[float, float, float]:
    """``(speedup, lo, hi)`` = 1 / ``time_fraction`` at the central rates, and its 2.5 / 97.5 percentiles
    over :data:`N_SAMPLES` draws of every rate."""
    point = 1.0 / float(time_fraction({k: r.value for k, r in params.items()}))
    rng = np.random.default_rng(seed)
    draws = 1.0 / np.asarray(time_fraction({k: _sample(r, N_SAMPLES, rng) for k, r in params.items()}))
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return point, float(min(lo, point)), float(max(hi, point))


def amdahl(shares: Mapping[str, float], rates: Mapping[str, Rate], seed: int = 0) -> tuple[float, float, float]:
    """``1 / sum(share_c / rate_c)`` (classes without a rate are unchanged) with its Monte-Carlo interval."""
    rest = 1.0 - sum(shares[c] for c in rates if c in shares)

    def frac(v: Mapping[str, Any]) -> Any:
        return rest + sum(shares.get(c, 0.0) / v[c] for c in rates)

    return monte_carlo(frac, rates, seed)


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _fmt(s: float, lo: float, hi: float) -> str:
    return f"{s:.2f}x [{lo:.2f}, {hi:.2f}]"


__all__ = ["COMPUTE", "N_SAMPLES", "Prediction", "Rates", "amdahl", "monte_carlo"]
