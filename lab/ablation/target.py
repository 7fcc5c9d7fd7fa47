"""Time to target per arm: how long each arm's runs took to reach one quality, as a ratio with a CI.

The target is ``target_metric`` of the baseline's config when it names one (``lab ablate --target-metric X``),
else the baseline's final metric (median over its runs) minus the accuracy budget (points for a higher-is-better
fraction, the metric's own units otherwise, plus for a lower-is-better one). Each run's time is
:func:`lab.result.timeline.time_to_target` from its evaluation curve (``eval_every``) or, for a model made after
training, its end-to-end time if that model reaches the target. ``ttt_speedup`` = median baseline time / median
arm time with a bootstrap 95 % CI over the runs (repeats x seeds); an arm with a run that never reached the
target has no ratio and says so in ``ttt_reached`` ("2/3 reached"), and ``one_off_s`` / ``end_to_end_s`` are the
medians of the runs' one-off costs and time to a trained model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lab.measure import bootstrap_ratio_ci, median
from lab.result import RunResult
from lab.result.timeline import end_to_end_s, one_off_costs, time_to_target

COLUMNS = ["one_off_s", "end_to_end_s", "target_metric", "ttt_s", "ttt_speedup", "ttt_speedup_lo", "ttt_speedup_hi",
           "ttt_reached"]


def default_target(base_ok: Sequence[RunResult], budget_pt: float) -> float | None:
    """The config's ``target_metric``, else the baseline's final metric minus the budget (None without one)."""
    for r in base_ok:
        target = (r.config or {}).get("target_metric")
        if target is not None:
            return float(target)
    metrics = [r.metric for r in base_ok if r.metric is not None and math.isfinite(r.metric)]
    if not metrics:
        return None
    hib = base_ok[0].higher_is_better
    budget = budget_pt / 100.0 if hib else budget_pt
    return median(metrics) - budget if hib else median(metrics) + budget


def run_ttt(r: RunResult, target: float) -> float | None:
    """Seconds until ``r`` first reached ``target`` (None: never, or no curve to tell)."""
    got = time_to_target(target=target, higher_is_better=r.higher_is_better, curve=r.details.get("eval_curve") or [],
                         final_metric=r.metric, train_time_s=r.train_time_s, details=r.details, config=r.config or {})
    return got["s"] if got["reached"] else None


def ttt_columns(base_ok: Sequence[RunResult], ok: Sequence[RunResult], target: float | None) -> dict[str, Any]:
    """The :data:`COLUMNS` of one arm (``ok``: its finished runs) against the baseline's finished runs."""
    row: dict[str, Any] = {c: math.nan for c in COLUMNS if c != "ttt_reached"}
    if ok:
        row["one_off_s"] = median([(r.details.get("one_off_s") or one_off_costs(r.details))["total"] for r in ok])
        row["end_to_end_s"] = median([end_to_end_s(r.train_time_s, r.details) for r in ok])
    row["ttt_reached"] = None
    curves = any(r.details.get("eval_curve") for r in [*base_ok, *ok])
    if target is None or not ok or not curves:
        return row
    row["target_metric"] = target
    times = [run_ttt(r, target) for r in ok]
    base = [t for t in (run_ttt(r, target) for r in base_ok) if t is not None]
    reached = [t for t in times if t is not None]
    row["ttt_reached"] = f"{len(reached)}/{len(times)} reached" if len(reached) < len(times) else "reached"
    if not reached:
        row["ttt_reached"] = "never reached"
        return row
    row["ttt_s"] = median(reached)
    if len(reached) == len(times) and base and len(base) == len(base_ok):
        row["ttt_speedup"], row["ttt_speedup_lo"], row["ttt_speedup_hi"] = bootstrap_ratio_ci(base, reached)
    return row


__all__ = ["COLUMNS", "default_target", "run_ttt", "ttt_columns"]
