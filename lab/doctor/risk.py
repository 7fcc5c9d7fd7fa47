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
- **the decision** (:func:`decide`, :data:`RULE`): the calibrated run interval is read as a predictive
  distribution of the log run-speedup, a normal centred on the run figure whose lower side puts the interval's
  lower end at its 5 % quantile (a 90 % two-sided interval), never narrower than the A/A noise (calibration
  floors it; here it is floored again for an uncalibrated prediction). A pick is *prescribed* when (a) its
  predicted gain is larger than the A/A noise (a gain a verification cannot tell from noise is not one) and
  (b) the probability that it is faster than the baseline is at least :attr:`Rule.confidence` (0.8). The
  first risk-aware rule (:data:`LOWER_END`) asked the interval's lower end itself to clear 1, a one-sided
  95 %: on the quiet pasted set its predictions were right to 4 % and it still prescribed nothing on 6/6 models
  while bf16 and fused Adam measured 1.13-1.19x (their bands x/ 1.2-1.6 against gains of 4-16 %).
  Why 0.8: a user who tries the pick and keeps it when it pays loses one short trial when it does not, and
  gains the whole run when it does; refusing every pick that a 1-in-5 chance could lose is the cost-balanced
  threshold for a loss about four times the size of the gain the doctor sees (its compile blunders, 0.45-0.75x
  against 1.1-1.2x gains), and tighter than that only buys "nothing prescribed".
  When no pick qualifies, the doctor says :data:`NOTHING_PAYS` and the first line is the baseline.
- **the rank**: prescribed picks first, then by the **expected share of the run's time saved**,
  ``1 - E[1 / S]`` over that distribution (the variance costs: of two picks with the same centre the surer one
  ranks first), then by the run interval's lower end. Compile's one-off cost is in the run figure and its
  lower end, so on a short run it ranks out and is never prescribed.

Pure functions over predictions and plain numbers: tests plant them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from lab.doctor.amdahl import Prediction, Rates
from lab.doctor.predict_compile import compile_time_s
from lab.measure.profile import Breakdown
from lab.precision.inrun import INRUN_COST_SHARE, probe_pays

#: Compile seconds when nothing measured them: (central, low, high).
COMPILE_S_PRIOR = (20.0, 8.0, 70.0)
#: The first line when no training pick is surely enough faster than the baseline beyond the A/A noise (:func:`decide`).
NOTHING_PAYS = "nothing here pays beyond noise: keep the baseline"
_AXES = {"train_step": 0, "inference": 1}
#: The standard normal quantile at 95 %: a calibrated 90 % two-sided interval's lower end sits this many
#: standard deviations below its centre (log space).
Z95 = NormalDist().inv_cdf(0.95)


@dataclass(frozen=True)
class Rule:
    """How sure a pick must be to be prescribed, and how prescribed picks are ranked (module docstring).

    ``confidence``: the least probability that the pick is faster than the baseline; ``rank``: ``"expected"``
    (the expected share of the run's time saved) or ``"lower_end"`` (the run interval's lower end)."""

    confidence: float
    rank: str
    name: str = ""

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence={self.confidence} is invalid: allowed: 0.5 <= confidence < 1")
        if self.rank not in ("expected", "lower_end"):
            raise ValueError(f"rank={self.rank!r} is invalid: allowed: 'expected', 'lower_end'")


#: The first risk-aware rule: the 90 % interval's lower end must clear 1 (one-sided 95 %), ranked by that lower end.
LOWER_END = Rule(0.95, "lower_end", "lower end > 1 (one-sided 95 %)")
#: The rule in force: faster than the baseline with probability >= 0.8, ranked by the expected time saved.
SURE_ENOUGH = Rule(0.8, "expected", "P(faster) >= 80 %, by expected time saved")
RULE = SURE_ENOUGH
RULES = {"lower_end": LOWER_END, "sure_enough": SURE_ENOUGH}


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` makes of one run interval: the probability the pick is faster than the baseline, the
    expected share of the run's time saved, and whether it is prescribed."""

    p_faster: float
    expected_saving: float
    prescribed: bool


def decide(s: float, lo: float, hi: float, noise: float = 0.0, rule: Rule = RULE) -> Decision:
    """The decision on a run figure ``s`` with its calibrated 90 % interval ``[lo, hi]`` (already floored at
    the A/A noise) and the A/A noise ``noise`` (a log half-width): a normal on ``log S`` centred at ``log s``,
    its lower side's sd ``log(s / lo) / Z95``, its upper side's ``log(hi / s) / Z95`` (the mean of the two for
    the expected saving). Prescribed when ``s > exp(noise)`` and ``P(S > 1) >= rule.confidence``."""
    mu = math.log(max(s, 1e-9))
    sd_lo = max(math.log(max(s, 1e-9) / max(lo, 1e-9)), 0.0) / Z95
    sd_hi = max(math.log(max(hi, 1e-9) / max(s, 1e-9)), 0.0) / Z95
    p = (1.0 if mu > 0 else 0.0) if sd_lo == 0 else 1.0 - NormalDist(mu, sd_lo).cdf(0.0)
    sd = (sd_lo + sd_hi) / 2
    saving = 1.0 - math.exp(-mu + sd * sd / 2)
    # P(S > 1) >= confidence, as "the one-sided lower end at that confidence clears 1" (exact for LOWER_END)
    sure = mu - NormalDist().inv_cdf(rule.confidence) * sd_lo > 0
    return Decision(p, saving, bool(mu > noise and sure))


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
              noise: float = 0.0, rule: Rule = RULE) -> list[Prediction]:
    """Each prediction with its one-off cost, run figures and ``prescribed`` flag, ranked (module docstring).
    ``overrides``: technique -> its config overrides (what says compile or ``auto``); ``noise``: the A/A noise as
    a log half-width (:meth:`lab.doctor.calibration.Calibration.noise_floor`); ``rule``: :data:`RULE` unless
    scoring another (``benchmarks/doctor.py --rules``)."""
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
        dec = decide(s, lo, max(hi, s), noise, rule)
        reason += f"; P(faster than the baseline) {100 * dec.p_faster:.0f} %"
        out.append(dataclasses.replace(p, one_off_s=c, run_speedup=s, run_lo=lo, run_hi=max(hi, s),
                                       prescribed=dec.prescribed, p_faster=dec.p_faster,
                                       expected_saving=dec.expected_saving, reason=reason))
    return sorted(out, key=lambda p: rank_key(p.axis, p.prescribed, p.expected_saving, p.run_lo, p.run_speedup,
                                              rule))


def rank_key(axis: str, prescribed: bool | None, saving: float | None, lo: float | None, s: float | None,
             rule: Rule = RULE) -> tuple:
    """The sort key of :func:`prescribe` (and of :func:`represcribe_rows`): axis, prescribed first, then the
    rule's figure, then the others."""
    first = -(saving if saving is not None else -math.inf) if rule.rank == "expected" else -(lo or 0.0)
    second = -(lo or 0.0) if rule.rank == "expected" else -(s or 0.0)
    return (_AXES.get(axis, 2), not prescribed, first, second)


def represcribe_rows(rows: Sequence[Mapping[str, Any]], *, rule: Rule = RULE, steps: int = 40,
                     noise: float | None = None) -> list[dict[str, Any]]:
    """Stored verification rows (:func:`lab.doctor.compare`) re-ranked and re-flagged under ``rule``, from what
    they store: the calibrated per-step interval and, where stored, the run figures (``run_speedup``,
    ``run_lo``, ``run_hi``, ``one_off_s``, ``run_steps``, ``run_step_ms``, ``noise``). Rows stored before the run
    figures existed get them here: compile pays the prior :data:`COMPILE_S_PRIOR` over ``steps`` steps of the
    profiled baseline's step (``baseline_step_ms``), nothing else pays a one-off (``auto`` is not probed on a
    verification's short run), and the noise is 0 (their intervals were floored at calibration time).
    What ``benchmarks/doctor.py --rescore --rules`` scores a rule change with, without a new measurement."""
    out = []
    for r in rows:
        r = dict(r)
        if r.get("axis", "train_step") == "train_step":
            s_step, lo_step, hi_step = r["predicted"], r["predicted_lo"], r["predicted_hi"]
            step_ms = r.get("run_step_ms") or r.get("baseline_step_ms")
            run = RunLength(int(r.get("run_steps") or steps), float(step_ms or 0.0))
            if r.get("run_speedup") is not None and r.get("run_lo") is not None:
                s, lo = r["run_speedup"], r["run_lo"]
                hi = r.get("run_hi") or over_run(hi_step, run, r.get("one_off_s") or 0.0)
            elif r["technique"].startswith("compile") and step_ms:
                c, c_lo, c_hi = COMPILE_S_PRIOR
                s, lo, hi = over_run(s_step, run, c), over_run(lo_step, run, c_hi), over_run(hi_step, run, c_lo)
            else:
                s, lo, hi = s_step, lo_step, hi_step
            n = r.get("noise") if noise is None else noise
            n = n or 0.0
            lo = min(lo, s * math.exp(-n))
            dec = decide(s, lo, max(hi, s), n, rule)
            r.update(run_speedup=s, run_lo=lo, run_hi=max(hi, s), prescribed=dec.prescribed,
                     p_faster=dec.p_faster, expected_saving=dec.expected_saving)
        out.append(r)
    return sorted(out, key=lambda r: rank_key(r.get("axis", "train_step"), r.get("prescribed"),
                                              r.get("expected_saving"), r.get("run_lo"), r.get("run_speedup"), rule))


def prescription(predictions: Sequence[Prediction], axis: str = "train_step") -> Prediction | None:
    """The first prescribed pick on ``axis`` (``None``: :data:`NOTHING_PAYS`)."""
    return next((p for p in predictions if p.axis == axis and p.prescribed), None)


__all__ = ["COMPILE_S_PRIOR", "LOWER_END", "NOTHING_PAYS", "RULE", "RULES", "SURE_ENOUGH", "Z95", "Decision", "Rule",
           "RunLength", "decide", "one_off_s", "over_run", "prescribe", "prescription", "rank_key",
           "represcribe_rows"]
