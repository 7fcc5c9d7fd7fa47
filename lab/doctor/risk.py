"""The prescription: ranked by a risk-aware figure over the run's length, and nothing prescribed that noise explains.

Why: ranked by its point estimate, the doctor put ``compile 1.23x [0.69, 1.97]`` first on a minimal GPT
and it measured 0.75x, while the two picks below it (1.21x, whose intervals stayed above 1) measured 1.18-1.19x.
A user acts on the first line, so the first line must be the pick least likely to lose, over the run the user
will train, costs included:

- **one-off costs over the run's length** (:func:`one_off_s`): compile pays its compile once per run (measured
  with ``--measure compile``, else estimated from the chain's compile times, else a prior of 20 s [8, 70]: ~22 s
  for the transformer tiny on intel-xeon-processor-amx-2c, 66 s for a minimal GPT on a Zen 4);
  ``auto`` pays its in-run probe (at most :data:`lab.precision.inrun.INRUN_COST_SHARE` of the run, plus a step)
  only on a run long enough to be probed (:func:`lab.precision.inrun.probe_pays`); a shorter one decides
  without probing and pays nothing. ``run_speedup`` = the run's baseline time over the pick's (its steps at the
  per-step speedup plus the one-off), its interval from the per-step interval's ends with the one-off's high
  estimate at the low end and its low one at the top. A 64-step run at 5 ms a step cannot repay a 20 s compile: 0.02x.
- **the rank** (:func:`prescribe`): prescribed picks first, then by the run interval's *lower* end, then by the
  central run figure. The lower end of a calibrated interval is where the doctor's own past errors say the
  pick may land; ranking by it prefers a 1.2x measured on this model over a 1.3x from a prior.
- **nothing that noise explains** : a pick is *prescribed* only when its run interval's lower end is above 1,
  and that interval is never narrower than the A/A noise of the verifications (calibration floors it; here it
  is floored again for an uncalibrated prediction). When no pick clears it, the doctor says
  :data:`NOTHING_PAYS` and the first line is the baseline.

Pure functions over predictions and plain numbers: tests plant them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lab.doctor.amdahl import Prediction, Rates
from lab.doctor.predict_compile import compile_time_s
from lab.measure.profile import Breakdown
from lab.precision.inrun import INRUN_COST_SHARE, probe_pays

#: Compile seconds when nothing measured them: (central, low, high).
COMPILE_S_PRIOR = (20.0, 8.0, 70.0)
#: The first line when no training pick's run interval clears 1 beyond the A/A noise.
NOTHING_PAYS = "nothing here pays beyond noise: keep the baseline"
_AXES = {"train_step": 0, "inference": 1}


@dataclass(frozen=True)
class RunLength:
    """The run a prescription is for: ``steps`` training steps of ``step_ms`` each (the baseline's)."""

    steps: int
    step_ms: float
    what: str = "this run"

    @property
    def seconds(self) -> float:
        return self.steps * self.step_ms / 1e3


def one_off_s(technique: str, overrides: Mapping[str, Any], run: RunLength, r: Rates | None = None,
              b: Breakdown | None = None, n_arms: int = 2) -> tuple[float, float, float, str]:
    """``(central, low, high, what)``: the seconds ``technique`` pays once per run of ``run`` (0 when none)."""
    if overrides.get("compute.compile"):
        if r is not None and r.model_compile is not None and r.model_compile_s > 0:
            s = r.model_compile_s
            return s, s, 1.2 * s, f"its compile {s:.0f} s (measured on this model)"
        if r is not None and r.compile is not None and b is not None:
            s = compile_time_s(b, r.compile)
            return s, s, 3.0 * s, f"its compile ~{s:.0f} s (estimated from the chain's compile times, a lower estimate)"
        c, lo, hi = COMPILE_S_PRIOR
        return c, lo, hi, f"its compile ~{c:.0f} s [{COMPILE_S_PRIOR[1]:.0f}, {hi:.0f}] (prior, not measured)"
    if overrides.get("precision.dtype") == "auto":
        pays, why = probe_pays(run.steps, n_arms)
        if not pays:
            return 0.0, 0.0, 0.0, f"no probe: {why}"
        cap = INRUN_COST_SHARE * run.seconds + run.step_ms / 1e3
        return cap / 2, 0.0, cap, f"its in-run probe, at most {cap:.2g} s ({INRUN_COST_SHARE:.0%} of the run + a step)"
    return 0.0, 0.0, 0.0, ""


def over_run(speedup: float, run: RunLength, one_off: float) -> float:
    """The run's baseline time over the pick's: its steps at ``speedup`` plus ``one_off`` seconds."""
    base = run.seconds
    if base <= 0:
        return speedup
    return base / (base / max(speedup, 1e-9) + one_off)


def prescribe(predictions: Sequence[Prediction], run: RunLength, *, overrides: Mapping[str, Mapping[str, Any]]
              | None = None, rates: Rates | None = None, breakdown: Breakdown | None = None,
              noise: float = 0.0) -> list[Prediction]:
    """Each prediction with its one-off cost, run figures and ``prescribed`` flag, ranked (module docstring).
    ``overrides``: technique -> its config overrides (what says compile or ``auto``); ``noise``: the A/A noise as
    a log half-width (:meth:`lab.doctor.calibration.Calibration.noise_floor`)."""
    overrides = overrides or {}
    out = []
    for p in predictions:
        if p.axis == "train_step":
            c, lo_s, hi_s, what = one_off_s(p.technique, overrides.get(p.technique, {}), run, rates, breakdown)
            s, lo, hi = over_run(p.speedup, run, c), over_run(p.lo, run, hi_s), over_run(p.hi, run, lo_s)
        else:  # inference: no one-off the doctor charges
            c, what, (s, lo, hi) = 0.0, "", (p.speedup, p.lo, p.hi)
        lo = min(lo, s * math.exp(-noise))
        reason = p.reason
        if c > 0 or what.startswith("no probe"):
            reason += (f"; over {run.what} ({run.steps:,} steps at {run.step_ms:.3g} ms) with {what}: "
                       f"{s:.2f}x [{lo:.2f}, {hi:.2f}]")
        out.append(dataclasses.replace(p, one_off_s=c, run_speedup=s, run_lo=lo, run_hi=max(hi, s),
                                       prescribed=lo > 1.0, reason=reason))
    return sorted(out, key=lambda p: (_AXES.get(p.axis, 2), not p.prescribed, -(p.run_lo or 0.0),
                                      -(p.run_speedup or 0.0)))


def prescription(predictions: Sequence[Prediction], axis: str = "train_step") -> Prediction | None:
    """The first prescribed pick on ``axis`` (``None``: :data:`NOTHING_PAYS`)."""
    return next((p for p in predictions if p.axis == axis and p.prescribed), None)


__all__ = ["COMPILE_S_PRIOR", "NOTHING_PAYS", "RunLength", "one_off_s", "over_run", "prescribe", "prescription"]
