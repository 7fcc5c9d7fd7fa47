"""The memory trade, per arm: what each configuration's peak memory and step time are against the baseline's,
and which configurations are on the Pareto front (no other one holds less memory *and* steps faster).

Why its own rows and not the ablation table's ``peak_memory_mb``: on CPU that column is the process RSS, ~0.3 GB of
Python and torch runtime that no memory lever moves, so a lever that halves the step's own bytes reads as a few
per cent there. The trade reads each run's peak by the measure the budget search uses
(:func:`lab.ablation.memory_budget.run_peak_mb`): ``step`` (the step's real peak, ``step_peak_bytes``: a budget
search's tries measure it, and so do the runs of a memory ablation and of ``lab project``, on a warm-up step:
:func:`lab.ablation.runner.run_ablation`'s ``step_peak``), ``roles`` (parameters + gradients + optimizer state +
saved activations, ``details["memory"]``: the fallback for runs stored before they measured their step, said in
``measure_note``), ``cuda`` (the allocator's
peak) or ``rss``. Two sources, one row shape:

- :func:`from_ablation`: an ablation's stored runs. The peak ratio is median(arm) / median(baseline) over the
  runs and the step-time ratio median(arm) / median(baseline) over the pooled measured steps, each with a
  bootstrap 95 % interval from :data:`MIN_RUNS` runs per arm (none below: one run is no interval); the A/A arm
  is a row (its interval is the noise floor) but never on the front.
- :func:`from_budget`: ``lab run --memory-budget``'s search record (``details["memory_budget"]``): every measured
  try against the budget-free one, no interval (each is one short try, and says so), the budget as a line.

Row keys: ``name``, ``kind`` (``baseline`` / ``aa`` / ``arm`` / ``try``), ``peak_mb``, ``peak_ratio`` with
``peak_lo`` / ``peak_hi``, ``step_ms``, ``time_ratio`` with ``time_lo`` / ``time_hi``, ``fits`` (None without a
budget), ``front``, ``chosen`` (the budget's answer), ``runs`` and ``accuracy`` (the arm's accuracy change over
seeds as the ablation table says it, when the table is given; empty for a budget try). The trade: ``{"measure",
"baseline_peak_mb", "budget_mb", "budget_ratio", "rows", "source"}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from lab.ablation.memory_budget import run_peak_mb
from lab.ablation.summary import AA_ARM, MIN_RUNS
from lab.measure import bootstrap_ratio_ci, median
from lab.result import RunResult
from lab.store import ResultStore

ROLE_KEYS = ("params_bytes", "grads_bytes", "optimizer_state_bytes", "saved_activations_bytes")
MEASURE_LABELS = {"step": "a training step's real peak in tensor bytes (params + optimizer state + its allocation "
                           "high water)",
                  "roles": "tensor bytes by role (params + grads + optimizer state + saved activations)",
                  "cuda": "CUDA allocator peak", "rss": "process peak RSS"}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _counted(r: RunResult) -> bool:
    rec = r.details.get("memory") or {}
    return all(rec.get(k) is not None for k in ROLE_KEYS)


def pick_measure(results: Sequence[RunResult]) -> str:
    """``cuda`` when the runs' peaks are the CUDA allocator's, ``step`` when every run measured its step's real
    peak (``step_peak_bytes``), ``roles`` when every run counted its step by role, else ``rss`` (the sampled
    process peak every run carries)."""
    ok = [r for r in results if r.status == "ok"]
    if ok and all(r.memory_kind == "cuda" for r in ok):
        return "cuda"
    if ok and all((r.details.get("memory") or {}).get("step_peak_bytes") is not None for r in ok):
        return "step"
    return "roles" if ok and all(_counted(r) for r in ok) else "rss"


def carries_memory(runs_by_arm: Mapping[str, Sequence[RunResult]]) -> bool:
    """Whether an ablation is a memory one worth the trade figure: an arm other than the baseline turns a memory
    lever on (its config's ``memory`` family differs from the defaults) and the runs have peaks to compare."""
    from dataclasses import asdict

    from lab.config.memory import MemoryConfig

    off = asdict(MemoryConfig())
    for arm, rs in runs_by_arm.items():
        if arm in ("baseline", AA_ARM):
            continue
        for r in rs:
            mem = (r.config or {}).get("memory") or {}
            if r.status == "ok" and any(mem.get(k, v) != v for k, v in off.items()):
                return True
    return False


def _ratio(arm: list[float], base: list[float], n_arm: int, n_base: int) -> tuple[float, float, float]:
    """median(arm) / median(base) with its bootstrap interval from MIN_RUNS runs each (NaN bounds below)."""
    if not arm or not base or not median(base):
        return math.nan, math.nan, math.nan
    est, lo, hi = bootstrap_ratio_ci(arm, base)
    if min(n_arm, n_base) < MIN_RUNS:
        return est, math.nan, math.nan
    return est, lo, hi


def from_ablation(runs_by_arm: Mapping[str, Sequence[RunResult]], *, baseline: str = "baseline",
                  measure: str = "auto", budget_mb: float | None = None, table: Any = None) -> dict[str, Any]:
    """The trade of an ablation's stored runs (module docstring). ``measure``: ``auto`` (:func:`pick_measure` over
    every arm's runs), ``roles``, ``cuda`` or ``rss``; ``table``: the ablation's summary, whose accuracy change per
    arm (over seeds, with its interval) each row then says beside its bytes and time (``accuracy``). Raises
    ``ValueError`` without a finished baseline run."""
    from lab.ablation.project import _accuracy

    said = {str(r["arm"]): _accuracy(r).lstrip(", ") for r in table.to_dict("records")} if table is not None else {}
    base_ok = [r for r in runs_by_arm.get(baseline, []) if r.status == "ok"]
    if not base_ok:
        raise ValueError(f"no finished {baseline!r} run: nothing to hold the memory trade against")
    note = None
    if measure == "auto":
        every = [r for rs in runs_by_arm.values() for r in rs]
        measure = pick_measure(every)
        note = fallback_note(every, measure)
    base_peaks = [p for r in base_ok if (p := run_peak_mb(r, measure)) is not None]
    base_steps = [x for r in base_ok for x in r.measured_ms()]
    rows = []
    for arm, rs in runs_by_arm.items():
        ok = [r for r in rs if r.status == "ok"]
        if not ok:
            continue
        peaks = [p for r in ok if (p := run_peak_mb(r, measure)) is not None]
        steps = [x for r in ok for x in r.measured_ms()]
        pr, plo, phi = _ratio(peaks, base_peaks, len(peaks), len(base_peaks))
        tr, tlo, thi = _ratio(steps, base_steps, len(ok), len(base_ok))
        if arm == baseline:  # exactly 1 by definition, not a bootstrap artefact (the A/A row is the noise floor)
            pr, plo, phi = (1.0, 1.0, 1.0) if _finite(pr) else (pr, plo, phi)
            tr, tlo, thi = (1.0, 1.0, 1.0) if _finite(tr) else (tr, tlo, thi)
        kind = "baseline" if arm == baseline else "aa" if arm == AA_ARM else "arm"
        rows.append({"name": arm, "kind": kind, "peak_mb": median(peaks) if peaks else math.nan,
                     "peak_ratio": pr, "peak_lo": plo, "peak_hi": phi,
                     "step_ms": median(steps) if steps else math.nan, "time_ratio": tr, "time_lo": tlo,
                     "time_hi": thi, "runs": len(ok), "chosen": False, "accuracy": said.get(arm, "")})
    trade = _finish(rows, measure, median(base_peaks) if base_peaks else math.nan, budget_mb, "ablation")
    if note:
        trade["measure_note"] = note
    return trade


def fallback_note(results: Sequence[RunResult], measure: str) -> str | None:
    """Why the trade reads ``roles`` (or ``rss``) and not the step's real peak, when it does on CPU: how many runs
    did not measure it (stored before runs recorded it, or fewer than 2 warm-up steps to measure it on)."""
    ok = [r for r in results if r.status == "ok"]
    if measure not in ("roles", "rss") or not ok:
        return None
    without = sum((r.details.get("memory") or {}).get("step_peak_bytes") is None for r in ok)
    return (f"{without} of {len(ok)} runs did not measure their step's real peak (stored before runs recorded it, "
            f"or fewer than 2 warm-up steps): read by {measure} instead")


def from_budget(found: Mapping[str, Any]) -> dict[str, Any]:
    """The trade of a budget search's record (:func:`lab.ablation.memory_budget.fit_budget`): each measured try
    (a batch-fallback try named with its batch) against the budget-free configuration, the budget as the line."""
    base = found.get("baseline")
    if not base or not _finite(base.get("peak_mb")):
        raise ValueError("the budget search measured no budget-free configuration: nothing to hold the trade against")
    chosen = found.get("chosen") or {}
    rows = []
    for c in found.get("candidates") or []:
        if c.get("status") != "measured" or not _finite(c.get("peak_mb")):
            continue
        name = c["name"] + (f" @ batch {c['batch_size']}" if "batch_size" in c else "")
        step, b_step = c.get("step_ms"), base.get("step_ms")
        rows.append({"name": name, "kind": "baseline" if c is base or c == base else "try", "peak_mb": c["peak_mb"],
                     "peak_ratio": c["peak_mb"] / base["peak_mb"], "peak_lo": math.nan, "peak_hi": math.nan,
                     "step_ms": step if _finite(step) else math.nan,
                     "time_ratio": step / b_step if _finite(step) and _finite(b_step) and b_step else math.nan,
                     "time_lo": math.nan, "time_hi": math.nan, "runs": 1, "accuracy": "",
                     "chosen": bool(chosen) and (c is chosen or c == chosen)})
    return _finish(rows, found.get("measure") or "roles", base["peak_mb"], found.get("budget_mb"), "budget")


def _finish(rows: list[dict[str, Any]], measure: str, base_peak: float, budget_mb: float | None,
            source: str) -> dict[str, Any]:
    for r in rows:
        r["fits"] = None if budget_mb is None or not _finite(r["peak_mb"]) else bool(r["peak_mb"] <= budget_mb)
    on = pareto_front(rows)
    for r in rows:
        r["front"] = r["name"] in on
    ratio = budget_mb / base_peak if budget_mb is not None and _finite(base_peak) and base_peak else None
    return {"measure": measure, "measure_label": MEASURE_LABELS.get(measure, measure), "baseline_peak_mb": base_peak,
            "budget_mb": budget_mb, "budget_ratio": ratio, "rows": rows, "source": source}


def _time(r: Mapping[str, Any]) -> str:
    """``1.26x the time per step [1.21, 1.31]`` (no interval below 3 runs, said so)."""
    if not _finite(r.get("time_ratio")):
        return "step time not measured"
    ci = (f" [{r['time_lo']:.2f}, {r['time_hi']:.2f}]" if _finite(r.get("time_lo")) and _finite(r.get("time_hi"))
          else " (no interval)")
    return f"{r['time_ratio']:.2f}x the time per step{ci}"


def _full_run(arm: str, projected: Mapping[str, Mapping[str, Any]] | None, baseline: str) -> str:
    """`` (full run 2.0 h -> 2.5 h)`` from the projection, when it has both."""
    from lab.ablation.project import duration_unit, fmt_duration

    b, a = (projected or {}).get(baseline) or {}, (projected or {}).get(arm) or {}
    if not (_finite(b.get("total_s")) and _finite(a.get("total_s"))):
        return ""
    unit = duration_unit(b["total_s"])
    return f" (full run {fmt_duration(b['total_s'], unit)} -> {fmt_duration(a['total_s'], unit)})"


def format_memory(trade: Mapping[str, Any], projected: Mapping[str, Mapping[str, Any]] | None = None,
                  baseline: str = "baseline") -> str:
    """Peak memory per arm with its step-time cost, then, given a budget, the seeds' sentence: "250 MB: does not fit
    (baseline 310 MB) -> fits at 241 MB with accum2, 1.26x the time per step [1.21, 1.31] (full run 2.0 h -> 2.5 h)".
    Every figure is a measured run's (the trade's rows; ``projected``: :func:`lab.ablation.project.project_arms`);
    an arm that fits is the fastest of those that do, and when none does the smallest peak reached is named."""
    rows = [r for r in trade["rows"] if r["kind"] != "aa" and _finite(r.get("peak_mb"))]
    lines = [f"peak memory per arm ({trade['measure']}: {trade['measure_label']}):"]
    if trade.get("measure_note"):
        lines.append(f"  ({trade['measure_note']})")
    for r in rows:
        if r["kind"] == "baseline":
            lines.append(f"  {r['name']} {r['peak_mb']:.4g} MB")
            continue
        ci = (f" [{r['peak_lo']:.2f}, {r['peak_hi']:.2f}]" if _finite(r.get("peak_lo")) and _finite(r.get("peak_hi"))
              and r["peak_hi"] > r["peak_lo"] else "")
        acc = f", {r['accuracy']}" if r.get("accuracy") else ""
        lines.append(f"  {r['name']} {r['peak_mb']:.4g} MB ({r['peak_ratio']:.2f}x{ci} the baseline's), "
                     f"{_time(r)}{acc}")
    budget = trade.get("budget_mb")
    if budget is None:
        return "\n".join(lines)
    base = next((r for r in rows if r["kind"] == "baseline"), None)
    head = f"{budget:g} MB"
    if base is not None and base["fits"]:
        return "\n".join([*lines, f"{head}: fits (baseline {base['peak_mb']:.4g} MB): no memory lever needed"])
    head += f": does not fit (baseline {base['peak_mb']:.4g} MB)" if base is not None else ": no baseline peak"
    fit = [r for r in rows if r["kind"] != "baseline" and r["fits"]]
    if fit:
        best = min(fit, key=lambda r: (r["time_ratio"] if _finite(r.get("time_ratio")) else math.inf, r["peak_mb"]))
        said = (f"{head} -> fits at {best['peak_mb']:.4g} MB with {best['name']}, {_time(best)}"
                f"{_full_run(best['name'], projected, baseline)}"
                + (f", {best['accuracy']}" if best.get("accuracy") else ""))
    elif len(rows) > 1:
        low = min(rows, key=lambda r: r["peak_mb"])
        said = (f"{head}; no measured arm fits either: the smallest peak is {low['peak_mb']:.4g} MB ({low['name']}); "
                "`lab run --memory-budget` searches the levers combined")
    else:
        said = f"{head}; no arm measured: add --recipe or --techniques (accum2, checkpoint_blocks, adam8bit, ...)"
    return "\n".join([*lines, said])


def stored_budget_searches(store: ResultStore, limit: int = 50) -> list[dict[str, Any]]:
    """The newest stored runs that a budget search chose (``details["memory_budget"]``), newest first:
    ``run_id``, ``started_at``, ``workload``, ``label``, ``budget_mb`` (read with SQLite's JSON functions, so no
    other run is parsed)."""
    rows = store.query("SELECT run_id, started_at, workload, label, "
                       "json_extract(result_json, '$.details.memory_budget.budget_mb') AS b FROM runs "
                       "WHERE b IS NOT NULL ORDER BY started_at DESC LIMIT ?", (int(limit),))
    return [{"run_id": r[0], "started_at": r[1], "workload": r[2], "label": r[3], "budget_mb": r[4]} for r in rows]


def pareto_front(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of the rows no other row dominates (at most the peak ratio *and* at most the time ratio, less in
    one), by their point estimates, cheapest in time first; the A/A arm and rows without both ratios are left
    out."""
    pts = [r for r in rows if r.get("kind") != "aa" and _finite(r.get("peak_ratio")) and _finite(r.get("time_ratio"))]

    def dominated(r: Mapping[str, Any]) -> bool:
        return any(o is not r and o["peak_ratio"] <= r["peak_ratio"] and o["time_ratio"] <= r["time_ratio"]
                   and (o["peak_ratio"] < r["peak_ratio"] or o["time_ratio"] < r["time_ratio"]) for o in pts)

    front = [r for r in pts if not dominated(r)]
    return [str(r["name"]) for r in sorted(front, key=lambda r: (r["time_ratio"], r["peak_ratio"]))]


__all__ = ["MEASURE_LABELS", "carries_memory", "fallback_note", "format_memory", "from_ablation", "from_budget",
           "pareto_front", "pick_measure", "stored_budget_searches"]
