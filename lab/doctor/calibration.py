"""Calibrated intervals: each prediction carries the doctor's own model error for its technique.

Why: a prediction's interval from its rates' intervals (:mod:`lab.doctor.amdahl`) only says how tightly the
*rates* were measured, not how right the *model* is; scored on its committed full run it held the measured
speedup in about half the pairs, and a rate measured to the percent printed zero-width intervals
(``fused_optim 1.11x [1.11, 1.11]``). So every interval is widened to a split-conformal band over the
doctor's residuals on other cases: for technique ``t`` with residuals ``e_i = |log(measured_i / predicted_i)|``
over ``n`` verified cases, the band is the ``ceil((n + 1) * coverage)``-th smallest ``e_i`` (infinite below
``1 / (1 - coverage) - 1`` residuals, so a technique with too few falls back to the residuals of every
technique pooled, then to :data:`PRIOR_BAND`, each said in the reason). The predicted interval becomes
``[min(lo, s * exp(-q)), max(hi, s * exp(q))]``: never narrower than what the model got wrong before.

And never narrower than the noise of the verification that will check it: the A/A arm of each verified
case (the baseline measured against itself) reads ``|log aa|`` away from 1, and a 90 % interval is at least
that distribution's conformal quantile wide on each side (:meth:`Calibration.noise_floor`).

The residuals come from the committed ``benchmarks/results/<hardware-id>/doctor.json`` of this machine
(:func:`load_calibration`), else from another machine's (named in the reason), else the prior, with the
held-out runs beside it; only *quiet* cases count (:func:`quiet`: every A/A arm within :data:`QUIET_AA`), so
the bands and the floor are the model's error and a quiet verification's noise, and a prediction made on a
busy machine is not prescribed at all (:mod:`lab.doctor.diagnosis`). A case being
predicted is left out of its own band (``exclude``), so the benchmark's coverage is held out.
Pure functions over plain dicts: tests feed synthetic residuals.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.bench import BENCH_DIR
from lab.doctor.amdahl import Prediction

#: Nominal coverage of every predicted interval.
NOMINAL = 0.9
#: The band (a log-ratio half-width) when no verified case exists at all: x/ 2, labelled a prior.
PRIOR_BAND = math.log(2.0)
#: A verified case calibrates only when its A/A arms read within x/ 1.03, the doctor's own run as much as the
#: held-out ones: a residual is the model's error *plus* the noise its verification read, and a band made of
#: noisy cases' residuals is the noise of those days, not the model. The gains the doctor must tell apart on
#: a CPU are 3-7 % (fused Adam, bf16 on the small models people paste), so a case whose A/A read more than
#: 3 % cannot show the model right or wrong on them. At x/ 1.1 (the first limit, set when the noisy HF cases,
#: A/A up to 1.69x, widened every band to x/ 3) the bands kept busy days' errors: fused Adam x/ 1.10, bf16
#: x/ 1.16 and an A/A floor of x/ 1.063 against quiet verifications that read 0.3 % A/A, and the doctor
#: refused real 3-7 % gains it had predicted to 1 % (docs/doctor.md, "The quiet-residual calibration").
QUIET_AA = math.log(1.03)


def case_key(case: Mapping[str, Any]) -> str:
    """``workload:size:rung`` of a doctor-benchmark case (the unit a band leaves out)."""
    return f"{case.get('workload')}:{case.get('size')}:{case.get('model_scale') or ''}"


def conformal_quantile(values: Sequence[float], coverage: float = NOMINAL) -> float:
    """The split-conformal quantile: the ``ceil((n + 1) * coverage)``-th smallest of ``values`` (``inf`` when
    that rank exceeds ``n``: too few residuals to promise ``coverage``)."""
    if not 0 < coverage < 1:
        raise ValueError(f"coverage={coverage} is invalid: allowed: 0 < coverage < 1")
    v = sorted(float(x) for x in values)
    k = math.ceil((len(v) + 1) * coverage)
    return v[k - 1] if 1 <= k <= len(v) else math.inf


@dataclass(frozen=True)
class Residual:
    """One verified prediction: ``log(measured / predicted)`` and the case it came from."""

    technique: str
    axis: str
    case: str
    log_ratio: float


@dataclass
class Calibration:
    """Residuals of verified predictions (and the A/A deviations of their verifications), to band new ones."""

    residuals: list[Residual] = field(default_factory=list)
    aa: dict[str, float] = field(default_factory=dict)  # case -> |log(A/A ratio)| of its verification
    source: str = "no verified cases"
    coverage: float = NOMINAL

    @classmethod
    def from_cases(cls, cases: Iterable[Mapping[str, Any]], source: str = "", *,
                   coverage: float = NOMINAL) -> Calibration:
        """From doctor-benchmark cases (``{"workload", "size", "model_scale", "rows": [compare rows]}``)."""
        res, aa = [], {}
        for c in cases:
            key = case_key(c)
            for r in c.get("rows", []):
                m, p = r.get("measured"), r.get("predicted")
                if m and p and m > 0 and p > 0:
                    res.append(Residual(r["technique"], r.get("axis", "train_step"), key, math.log(m / p)))
                a = r.get("aa_measured")
                if a and a > 0 and r.get("axis", "train_step") == "train_step":
                    aa[key] = abs(math.log(a))
        return cls(res, aa, source or f"{len({r.case for r in res})} verified cases", coverage)

    def without(self, case: str | None) -> Calibration:
        """The same calibration with one case left out (a prediction is never banded by its own residual)."""
        if case is None:
            return self
        return dataclasses.replace(self, residuals=[r for r in self.residuals if r.case != case],
                                   aa={k: v for k, v in self.aa.items() if k != case})

    def band(self, technique: str, axis: str = "train_step") -> tuple[float, str]:
        """``(q, how)``: the conformal half-width in log space for ``technique`` and where it came from."""
        own = [abs(r.log_ratio) for r in self.residuals if r.technique == technique and r.axis == axis]
        q = conformal_quantile(own, self.coverage)
        if math.isfinite(q):
            return q, f"{technique}'s residuals over {len(own)} verified cases ({self.source})"
        pooled = [abs(r.log_ratio) for r in self.residuals]
        q = conformal_quantile(pooled, self.coverage)
        if math.isfinite(q):
            return q, (f"only {len(own)} verified {technique} cases: every technique's residuals pooled "
                       f"({len(pooled)}, {self.source})")
        return PRIOR_BAND, "prior: no verified cases to calibrate on"

    def noise_floor(self) -> float:
        """The A/A noise a verification reads (conformal quantile of ``|log aa|``; 0 without A/A arms)."""
        q = conformal_quantile(list(self.aa.values()), self.coverage)
        return q if math.isfinite(q) else max(self.aa.values(), default=0.0)

    def apply(self, p: Prediction) -> Prediction:
        """``p`` with its interval widened to the band and the A/A floor (its model interval kept apart)."""
        q, how = self.band(p.technique, p.axis)
        floor = self.noise_floor()
        w = max(q, floor)
        lo, hi = min(p.lo, p.speedup * math.exp(-w)), max(p.hi, p.speedup * math.exp(w))
        wider = lo < p.lo or hi > p.hi
        what = (f"{100 * self.coverage:.0f} % interval [{lo:.2f}, {hi:.2f}] = the model's [{p.lo:.2f}, {p.hi:.2f}] "
                + ("widened by" if wider else "already holding") + f" its error x/ {math.exp(q):.2f} ({how})")
        if floor > q:
            what += f" and the A/A noise x/ {math.exp(floor):.2f}"
        return dataclasses.replace(p, lo=lo, hi=hi, model_lo=p.lo, model_hi=p.hi, band=what,
                                   reason=f"{p.reason}; {what}")


def doctor_json(hardware_id: str, root: Path | None = None) -> Path:
    return (root or BENCH_DIR / "results") / hardware_id / "doctor.json"


def quiet(case: Mapping[str, Any], limit: float = QUIET_AA) -> bool:
    """Every training-step A/A arm of ``case`` within ``exp(+-limit)`` of 1 (and at least one): its residuals
    measure the doctor, not the machine's load."""
    aa = [abs(math.log(r["aa_measured"])) for r in case.get("rows", [])
          if r.get("aa_measured") and r["aa_measured"] > 0 and r.get("axis", "train_step") == "train_step"]
    return bool(aa) and max(aa) <= limit


def heldout_cases(folder: Path) -> list[dict[str, Any]]:
    """The quiet cases (:func:`quiet`) of the held-out runs beside a doctor.json (``<hw>/heldout/*.json``)."""
    out = []
    for path in sorted((folder / "heldout").glob("*.json")):
        try:
            out += [c for c in json.loads(path.read_text())["cases"] if quiet(c)]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def load_calibration(hardware_id: str, root: Path | None = None, *, exclude: str | None = None) -> Calibration:
    """The quiet cases (:func:`quiet`) of this machine's committed doctor run, else another machine's (the first by
    name, said in ``source``), else an empty calibration (every band the prior); with the quiet cases of the
    held-out runs beside it (:func:`heldout_cases`: the gallery and HF models' residuals, which the built-in run
    alone under-banded).
    ``exclude``: a case key left out (every run of that case)."""
    root = root or BENCH_DIR / "results"
    own = doctor_json(hardware_id, root)
    others = sorted(p for p in root.glob("*/doctor.json") if p != own)
    for path in ([own] if own.is_file() else []) + others:
        try:
            cases = json.loads(path.read_text())["cases"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        extra = heldout_cases(path.parent)
        kept = [c for c in cases if quiet(c)]
        where = (f"{path.parent.name}/doctor.json" if path == own else
                 f"{path.parent.name}/doctor.json: no verified doctor run for {hardware_id}, another machine's")
        if len(kept) < len(cases):
            where += f" ({len(kept)} of its {len(cases)} cases quiet)"
        if extra:
            where += f" + {len(extra)} quiet held-out cases ({path.parent.name}/heldout/)"
        return Calibration.from_cases([*kept, *extra], where).without(exclude)
    return Calibration(source=f"no doctor.json under {root}")


def calibrated(predictions: Sequence[Prediction], cal: Calibration) -> list[Prediction]:
    return [cal.apply(p) for p in predictions]


__all__ = ["NOMINAL", "PRIOR_BAND", "QUIET_AA", "Calibration", "Residual", "calibrated", "case_key",
           "conformal_quantile", "doctor_json", "heldout_cases", "load_calibration", "quiet"]
