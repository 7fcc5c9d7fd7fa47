"""A full run, projected from a short measured one: ``python -m lab project``.

A user's question is "how long is *my* run": E epochs over N rows. From a measured run the projection takes

- the steps: the run's loader batches per epoch scaled by ``rows / n_train`` (its batch, drop-last, ranks and
  accumulation included), divided by ``ddp.grad_accum_steps``, times ``epochs``;
- the time per step: the **mean** of the measured steps (warm-up excluded) plus the loop's own time per step
  (``train_time_s`` minus the steps' sum, over the steps: hooks, memory samples, progress). A total is a sum,
  so the mean is its estimator (a median would drop the tail a long run pays); the interval is a bootstrap of
  that mean;
- the warm-up's excess over the steady step (compile is paid there, once);
- the evaluations: one every ``eval_every`` steps, each as long as the run's mean (scaled by ``test_rows / n_test``);
- the one-off costs outside the loop (:mod:`lab.result.timeline`): fine-tunes scale with the rows, checkpoint
  writes with the steps, the rest (probe, export, calibration, int8 compile, spawn) are paid once.

Per arm the estimate is the median of its runs' projections, with a bootstrap interval over runs (3 or more),
else the step-mean interval of its one run; said the seeds' way by :func:`format_projection`. A run projected to its
own epochs and rows gives back its own end-to-end time (:func:`lab.result.timeline.end_to_end_s`).

:func:`project_steps` is the arithmetic without a run (a step time, steps per epoch, evaluation cost, one-off
costs): the doctor's prescription in hours calls it with its predicted step. :func:`seeds_way` is the one sentence
a headline or a verdict line says ("baseline 24.0 h -> bf16+prefetch 16.3 h [15.1, 17.4] end to end (per step
1.52x [1.40, 1.61]), accuracy -0.2 pt [-0.4, +0], peak memory 410 -> 380 MB"), from measured end-to-end times
(:func:`measured_arms`) or projected ones (:func:`project_arms`): the user's unit first, the per-step ratio the
lab measures best beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lab.measure import bootstrap_ci, median
from lab.result import RunResult
from lab.result.timeline import IN_LOOP, end_to_end_s, one_off_costs

#: One-off parts that are epochs over the data (scale with the rows) and that scale with the steps.
SCALE_WITH_ROWS = ("prune_finetune", "qat_finetune")
SCALE_WITH_STEPS = ("checkpoint_writes",)
MIN_RUNS = 3


def project_run(r: RunResult, *, epochs: int, rows: int | None = None, test_rows: int | None = None,
                eval_every: int | None = -1) -> dict[str, Any]:
    """The full run of ``epochs`` epochs over ``rows`` training rows (default: the run's own), from ``r``.
    ``eval_every=-1`` keeps the run's own evaluation cadence (``None``: no evaluation during training).
    Returns seconds: ``total_s`` with ``lo_s`` / ``hi_s`` and the parts."""
    if epochs < 1:
        raise ValueError(f"epochs={epochs} is invalid: allowed: >= 1")
    resolved, details, cfg = r.details.get("resolved") or {}, r.details, r.config or {}
    n_train, n_test = int(resolved.get("n_train") or 0), int(resolved.get("n_test") or 0)
    loader_batches = int(resolved.get("steps_per_epoch") or 0)
    measured = r.measured_ms()
    if r.status != "ok" or not n_train or not loader_batches or not measured:
        raise ValueError(f"run {r.run_id[:8]} cannot be projected: it needs status ok, measured steps and "
                         "details['resolved'] (a run of this lab)")
    rows = n_train if rows is None else int(rows)
    if rows < 1:
        raise ValueError(f"rows={rows} is invalid: allowed: >= 1")
    accum = int((cfg.get("ddp") or {}).get("grad_accum_steps", 1) or 1)
    steps_per_epoch = max(1, round(loader_batches * rows / n_train) // accum)
    steps = epochs * steps_per_epoch
    all_ms = r.step_times_ms.get("total", [])
    mean_s, lo_s, hi_s = (x / 1e3 for x in bootstrap_ci(measured, np.mean))
    overhead_s = max(0.0, (r.train_time_s - sum(all_ms) / 1e3) / max(r.steps, 1))
    warm = all_ms[: r.warmup_steps]
    warmup_excess_s = max(0.0, sum(warm) / 1e3 - len(warm) * mean_s)
    every = details.get("eval_every") if eval_every == -1 else eval_every
    curve = details.get("eval_curve") or []
    per_eval_s = float(np.mean([p["eval_s"] for p in curve])) if curve else 0.0  # a sum again: the mean
    per_eval_s *= (test_rows / n_test) if test_rows and n_test else 1.0
    one_off = details.get("one_off_s") or one_off_costs(details)
    fixed = {}
    for k, v in one_off.items():
        if k == "total" or k in IN_LOOP:  # compile is in the warm-up excess
            continue
        fixed[k] = v * (rows / n_train if k in SCALE_WITH_ROWS else steps / max(r.steps, 1)
                        if k in SCALE_WITH_STEPS else 1.0)
    out = project_steps(mean_s + overhead_s, step_lo_s=lo_s + overhead_s, step_hi_s=hi_s + overhead_s,
                        steps_per_epoch=steps_per_epoch, epochs=epochs, per_eval_s=per_eval_s,
                        eval_every=every if curve else None, one_off_s=fixed, warmup_excess_s=warmup_excess_s)
    return {"rows": rows, **out, "step_s": mean_s, "loop_overhead_s": overhead_s}


def project_steps(step_s: float, *, steps_per_epoch: int, epochs: int, step_lo_s: float | None = None,
                  step_hi_s: float | None = None, per_eval_s: float = 0.0, eval_every: int | None = None,
                  one_off_s: Mapping[str, float] | None = None, warmup_excess_s: float = 0.0) -> dict[str, Any]:
    """A full run from its parts, no run needed (the doctor's prescription in hours calls this with a predicted
    step): ``epochs * steps_per_epoch`` steps of ``step_s`` seconds (``step_lo_s`` / ``step_hi_s``: its interval,
    default the point), one evaluation of ``per_eval_s`` every ``eval_every`` steps (None: none), the one-off
    costs paid once (``one_off_s``, seconds by part, ``total`` ignored; compile's warm-up excess goes in
    ``warmup_excess_s``). Returns seconds: ``total_s``, ``lo_s``, ``hi_s``, ``train_s`` (the steps), ``eval_s``,
    ``one_off_total_s`` and the counts."""
    if epochs < 1 or steps_per_epoch < 1:
        raise ValueError(f"epochs={epochs}, steps_per_epoch={steps_per_epoch} are invalid: allowed: >= 1")
    if not step_s >= 0:
        raise ValueError(f"step_s={step_s} is invalid: allowed: seconds >= 0")
    steps = epochs * steps_per_epoch
    n_evals = math.ceil(steps / eval_every) if eval_every else 0
    fixed = {k: float(v) for k, v in (one_off_s or {}).items() if k != "total"}
    once = warmup_excess_s + sum(fixed.values())
    rest = once + n_evals * per_eval_s
    lo = step_s if step_lo_s is None else step_lo_s
    hi = step_s if step_hi_s is None else step_hi_s
    return {"epochs": epochs, "steps_per_epoch": steps_per_epoch, "steps": steps, "step_s": step_s,
            "warmup_excess_s": warmup_excess_s, "evaluations": n_evals, "eval_s": n_evals * per_eval_s,
            "one_off_s": fixed, "one_off_total_s": once, "train_s": steps * step_s,
            "total_s": steps * step_s + rest, "lo_s": steps * lo + rest, "hi_s": steps * hi + rest}


def project_arm(results: Sequence[RunResult], **kwargs: Any) -> dict[str, Any]:
    """The median of the runs' projections, with a bootstrap interval over runs (>= 3) or the one run's."""
    each = [project_run(r, **kwargs) for r in results if r.status == "ok"]
    if not each:
        return {"total_s": math.nan, "lo_s": math.nan, "hi_s": math.nan, "runs": 0}
    totals = [p["total_s"] for p in each]
    if len(each) >= MIN_RUNS:
        est, lo, hi = bootstrap_ci(totals)
    else:
        est, lo, hi = median(totals), median([p["lo_s"] for p in each]), median([p["hi_s"] for p in each])
    return {**each[0], "total_s": est, "lo_s": lo, "hi_s": hi, "runs": len(each), "each_s": totals}


def project_arms(runs: dict[str, list[RunResult]], **kwargs: Any) -> dict[str, dict[str, Any]]:
    """:func:`project_arm` per arm (the A/A arm left out: it is the baseline again)."""
    return {arm: project_arm(rs, **kwargs) for arm, rs in runs.items() if arm != "aa"}


def measured_arms(runs: dict[str, list[RunResult]]) -> dict[str, dict[str, Any]]:
    """Per arm the measured end-to-end time of its finished runs (loop + evaluations + one-off costs outside it):
    the median with a bootstrap interval over runs (>= 3; none below), in :func:`project_arms`'s form."""
    out = {}
    for arm, rs in runs.items():
        totals = [end_to_end_s(r.train_time_s, r.details) for r in rs if r.status == "ok"]
        if arm == "aa" or not totals:
            continue
        est, lo, hi = bootstrap_ci(totals) if len(totals) >= MIN_RUNS else (median(totals), math.nan, math.nan)
        out[arm] = {"total_s": est, "lo_s": lo, "hi_s": hi, "runs": len(totals), "each_s": totals}
    return out


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _accuracy(rec: Mapping[str, Any]) -> str:
    """", AUC -0.2 pt [-0.4, +0]" from an ablation row (empty without a figure): the metric's own name, the change as
    the metric moved (the stored loss is positive-is-worse; a lower-is-better metric's change is its loss), and a
    change below 0.005 reads 0 (not "-2e-05")."""
    loss, lo, hi = rec.get("acc_loss_pt"), rec.get("acc_loss_lo"), rec.get("acc_loss_hi")
    if not _finite(loss):
        return ""
    unit = rec.get("loss_unit") or "pt"
    flip = -1.0 if unit in ("pt", "points") else 1.0
    name = {"auc": "AUC"}.get(str(rec.get("metric_name") or ""), str(rec.get("metric_name") or "accuracy"))
    text = f", {name} {_change(flip * loss)}{' pt' if flip < 0 else ''}"
    if _finite(lo) and _finite(hi) and hi > lo:
        a, b = sorted((flip * lo, flip * hi))
        return text + f" [{_change(a)}, {_change(b)}]"
    return text + " (one seed: no interval)" if _finite(lo) and _finite(hi) else text  # [x, x] would claim certainty


def _change(x: float) -> str:
    return "0" if abs(x) < 0.005 else f"{x + 0.0:+.2g}"


def seeds_way(table: Any, times: Mapping[str, Mapping[str, Any]], arm: str | None = None,
              baseline: str = "baseline") -> str | None:
    """The headline sentence: end-to-end time first, the per-step ratio beside it, accuracy and peak memory,
    "baseline 24.0 h -> bf16+prefetch 16.3 h [15.1, 17.4] end to end (per step 1.52x [1.40, 1.61]), accuracy -0.2 pt
    [-0.4, +0], peak memory 410 -> 380 MB". ``table``: the ablation summary; ``times``: :func:`measured_arms` or
    :func:`project_arms`; ``arm``: the arm to say (default: the fastest end to end). None when there is nothing
    to compare (no baseline time, or no other arm with one)."""
    rows = {str(r["arm"]): r for r in table.to_dict("records")} if table is not None else {}
    base = times.get(baseline)
    others = {a: t for a, t in times.items() if a not in (baseline, "aa") and _finite(t.get("total_s"))}
    if not base or not _finite(base.get("total_s")) or not others:
        return None
    arm_was_picked = arm is None or arm not in others
    if arm_was_picked:
        # only an arm that competes on training time: post-training int8 or pruning leave the training as it is,
        # so "fastest end to end" among them is the baseline's own noise (the summary blanks that axis)
        trains = {a: t for a, t in others.items() if not rows or _finite((rows.get(a) or {}).get("train_speedup"))}
        if not trains:
            return None
        arm = min(trains, key=lambda a: trains[a]["total_s"])
    t, rec, b_rec = others[arm], rows.get(arm) or {}, rows.get(baseline) or {}
    unit = duration_unit(base["total_s"])
    said = f"{baseline} {fmt_duration(base['total_s'], unit)} -> {arm} {fmt_duration(t['total_s'], unit)}"
    if _finite(t.get("lo_s")) and _finite(t.get("hi_s")):
        lo, hi = (fmt_duration(t[k], unit).split()[0] for k in ("lo_s", "hi_s"))
        said += f" [{lo}, {hi}]"
    said += " end to end"
    step = rec.get("step_speedup")
    if _finite(step):
        ci = (f" [{rec['step_speedup_lo']:.2f}, {rec['step_speedup_hi']:.2f}]"
              if _finite(rec.get("step_speedup_lo")) and _finite(rec.get("step_speedup_hi")) else "")
        said += f" (per step {step:.2f}x{ci})"
    said += _accuracy(rec)
    if _finite(b_rec.get("peak_memory_mb")) and _finite(rec.get("peak_memory_mb")):
        said += f", peak memory {b_rec['peak_memory_mb']:.3g} -> {rec['peak_memory_mb']:.3g} MB"
    if t["total_s"] > base["total_s"]:  # a loss is said as one, never in the neutral words of a gain
        slower = f"{t['total_s'] / base['total_s']:.2f}x the baseline's time"
        lead = "no arm is faster end to end; the fastest" if arm_was_picked else "slower end to end"
        said = f"{lead} ({arm}) takes {slower}: {said}" if arm_was_picked else f"{lead}, {slower}: {said}"
    return said


def projection_rows(projected: Mapping[str, Mapping[str, Any]], table: Any = None,
                    baseline: str = "baseline") -> tuple[list[dict[str, Any]], str]:
    """(one row per arm, the unit): the full run with its interval, its parts (steps, evaluations, one-off costs:
    they stack to the full run) and the arm's peak memory, all in the baseline's unit (h, min or s), for a page's
    table and bars."""
    base = projected.get(baseline) or next(iter(projected.values()), {})
    unit = duration_unit(base["total_s"]) if _finite(base.get("total_s")) else "s"
    scale = {"h": 3600.0, "min": 60.0, "s": 1.0}[unit]
    mem = {str(r["arm"]): r.get("peak_memory_mb") for r in table.to_dict("records")} if table is not None else {}
    rows = []
    for arm, p in projected.items():
        if not _finite(p.get("total_s")):
            continue
        once = p.get("one_off_total_s", 0.0)
        rows.append({"arm": arm, f"full run ({unit})": p["total_s"] / scale, "lo": p["lo_s"] / scale,
                     "hi": p["hi_s"] / scale, f"training steps ({unit})": (p["total_s"] - once - p["eval_s"]) / scale,
                     f"evaluations ({unit})": p["eval_s"] / scale, f"one-off costs ({unit})": once / scale,
                     "peak memory (MB)": mem.get(arm) if _finite(mem.get(arm)) else None, "runs": p.get("runs"),
                     "steps": p.get("steps")})
    return rows, unit


def fmt_duration(s: float, unit: str | None = None) -> str:
    unit = unit or duration_unit(s)
    scale = {"h": 3600.0, "min": 60.0, "s": 1.0}[unit]
    return "n/a" if s != s else f"{s / scale:.3g} {unit}"


def duration_unit(s: float) -> str:
    return "h" if s >= 3600 else "min" if s >= 60 else "s"


def format_projection(projected: dict[str, dict[str, Any]], table: Any = None, baseline: str = "baseline") -> str:
    """"baseline 24.0 h -> bf16+prefetch 16.3 h [15.1, 17.4], accuracy -0.2 pt [-0.4, +0.0]", one arm a line;
    ``table``: the ablation summary (its accuracy loss and interval per arm), optional."""
    base = projected.get(baseline)
    unit = duration_unit(base["total_s"]) if base and base["total_s"] == base["total_s"] else None
    rows = {} if table is None else {rec["arm"]: rec for rec in table.to_dict("records")}

    def said(p: dict[str, Any]) -> str:
        lo, hi = (fmt_duration(p[k], unit).split()[0] for k in ("lo_s", "hi_s"))
        return f"{fmt_duration(p['total_s'], unit)}" + (f" [{lo}, {hi}]" if p.get("runs") else "")

    lines = []
    for arm, p in projected.items():
        if arm == baseline:
            lines.append(f"{baseline} {said(p)}   ({p.get('steps')} steps, {p.get('steps_per_epoch')} per epoch, "
                         f"{p.get('runs')} run(s))")
            continue
        acc = _accuracy(rows.get(arm) or {})
        head = f"{baseline} {fmt_duration(base['total_s'], unit)} -> " if base else ""
        lines.append(f"{head}{arm} {said(p)}{acc}")
    return "\n".join(lines)


__all__ = ["duration_unit", "fmt_duration", "format_projection", "measured_arms", "project_arm", "project_arms",
           "project_run", "project_steps", "projection_rows", "seeds_way"]
