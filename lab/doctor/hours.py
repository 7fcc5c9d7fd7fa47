"""The doctor's prescription in hours: the user's full run per top pick, with its interval.

Why: a per-step ratio is not what a user plans with ("24 h -> 16 h"). The profiled baseline is a run of this lab,
so :func:`lab.ablation.project.project_run` turns it into the baseline's full run of ``epochs`` over ``rows``
(its measured step and loop overhead, steps per epoch at the user's rows, its evaluation cadence, its one-off
costs). Each training pick is the same steps at that step divided by its predicted speedup (the calibrated
interval's ends give the run's interval: :func:`lab.ablation.project.project_steps`) plus the baseline's
evaluations and one-off costs, and its own one-off (:func:`lab.doctor.risk.one_off_s`: compile's compile,
measured with ``--measure compile`` or estimated; ``auto``'s probe). Without
``epochs`` and ``rows`` the unit is 1000 steps, so nothing is invented about the user's data.
"""

from __future__ import annotations

from typing import Any

from lab.ablation.project import duration_unit, fmt_duration, project_run, project_steps
from lab.doctor.diagnosis import Diagnosis

#: Steps of the per-1000-steps unit used when the user gives neither epochs nor rows.
PER_STEPS = 1000


def prescription_hours(d: Diagnosis, *, epochs: int | None = None, rows: int | None = None,
                       top: int = 3) -> dict[str, Any]:
    """The baseline's and the top ``top`` training picks' full runs in seconds (``total_s``, ``lo_s``, ``hi_s``
    each), over ``epochs`` (default: the run's own) x ``rows`` (default: the run's own) when either is given,
    else per :data:`PER_STEPS` steps. Raises ``ValueError`` when the baseline cannot be projected."""
    per_steps = epochs is None and rows is None
    own = int((d.baseline.details.get("resolved") or {}).get("epochs") or d.cfg.epochs or 1)
    base = project_run(d.baseline, epochs=epochs or own, rows=rows)
    if per_steps:  # the steps alone: evaluations and one-off costs depend on a run length nobody gave
        base = project_steps(base["step_s"] + base["loop_overhead_s"], steps_per_epoch=PER_STEPS, epochs=1)
    step_s = base["train_s"] / base["steps"]
    rest_s = base["total_s"] - base["train_s"]
    picks = []
    for p in [p for p in d.predictions if p.axis == "train_step"][:top]:
        one_off = {p.technique: p.one_off_s} if p.one_off_s > 0 else {}
        run = project_steps(step_s / p.speedup, step_lo_s=step_s / p.hi, step_hi_s=step_s / p.lo,
                            steps_per_epoch=base["steps"], epochs=1, one_off_s={"baseline's": rest_s, **one_off})
        note = (f"with its one-off {p.one_off_s:.3g} s" + ("" if d.rates.model_compile is not None or
                                                             p.technique != "compile" else " (estimated)")
                if one_off else "compile's own compile time not included (not estimated)" if p.technique == "compile"
                else "")
        if p.prescribed is False:
            note = "; ".join(x for x in (note, "not prescribed: not surely enough faster beyond noise") if x)
        picks.append({"technique": p.technique, "speedup": p.speedup, "total_s": run["total_s"],
                      "lo_s": run["lo_s"], "hi_s": run["hi_s"], "note": note})
    unit = (f"per {PER_STEPS} steps" if per_steps else
            f"{base['epochs']} epochs x {rows if rows is not None else 'the run' + chr(39) + 's'} rows")
    return {"unit": unit, "steps": base["steps"], "baseline": {"total_s": base["total_s"], "lo_s": base["lo_s"],
                                                              "hi_s": base["hi_s"]}, "picks": picks}


def format_hours(h: dict[str, Any]) -> str:
    """``full run (3 epochs x 1000000 rows, 61,000 steps): baseline 2.1 h -> compile 1.6 h [1.1, 2.9]; ...``."""
    b = h["baseline"]
    unit = duration_unit(b["total_s"])
    parts = [f"{p['technique']} {fmt_duration(p['total_s'], unit)} [{fmt_duration(p['lo_s'], unit)}, "
             f"{fmt_duration(p['hi_s'], unit)}]" + (f" ({p['note']})" if p["note"] else "") for p in h["picks"]]
    what = ("the baseline's measured step alone" if h["unit"].startswith("per ") else
            "the baseline's measured step, evaluations and one-off costs")
    return (f"full run ({h['unit']}, {h['steps']:,} steps): baseline {fmt_duration(b['total_s'], unit)} -> "
            + "; ".join(parts) + f" ({what}; each pick's step at its predicted speedup, its 90 % interval)")


__all__ = ["PER_STEPS", "format_hours", "prescription_hours"]
