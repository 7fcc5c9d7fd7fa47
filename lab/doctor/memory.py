"""The doctor's prescription under a memory budget: ``lab doctor --memory-budget MB``.

Why memory comes first: a step that does not fit never runs, so no speed figure matters until it does. The
prescription is the budget search's answer (:func:`lab.ablation.memory_budget.fit_budget`: the memory levers that
keep the effective batch, each measured on a short try, the fastest whose peak is under the budget), said with its
time cost against the budget-free configuration; or, when nothing fits, the search's one-line refusal naming the
smallest peak reached. Nothing here is predicted: every peak and step time is a try's measurement. The speed
prescription that follows was ranked on the budget-free configuration, and the line says so (the levers stack:
accumulation, checkpointing and low-bit state leave the techniques the doctor ranks applicable).
"""

from __future__ import annotations

from typing import Any

from lab.ablation.memory_budget import BudgetNotMet, MeasureFn, ProgressFn, fit_budget, resolve_measure
from lab.config import RunConfig


def memory_prescription(cfg: RunConfig, budget_mb: float, *, measure: str = "auto",
                        measure_fn: MeasureFn | None = None, progress: ProgressFn | None = None) -> dict[str, Any]:
    """``{"budget_mb", "measure", "fits", "option", "options", "peak_mb", "baseline_peak_mb", "step_time_ratio",
    "batch", "why", "search"}``: the fastest measured configuration of ``cfg`` under ``budget_mb`` (``option``:
    its name, ``baseline`` when no lever is needed), or ``fits`` False with the search's refusal in ``why``.
    ``measure_fn``: one try's measurement (tests plant one); a bad budget or measure raises ``ValueError``."""
    kind = resolve_measure(cfg, measure) if measure_fn is None else measure
    out: dict[str, Any] = {"budget_mb": budget_mb, "measure": kind}
    try:
        found = fit_budget(cfg, budget_mb, measure=kind, measure_fn=measure_fn, progress=progress)
    except BudgetNotMet as exc:
        return {**out, "fits": False, "option": None, "options": [], "why": str(exc), "search": None}
    chosen, base = found["chosen"], found.get("baseline") or {}
    return {**out, "fits": True, "option": chosen["name"], "options": list(chosen["options"]),
            "peak_mb": chosen["peak_mb"], "baseline_peak_mb": base.get("peak_mb"),
            "step_time_ratio": found.get("step_time_ratio"), "batch": found.get("batch"), "why": None,
            "search": found}


def format_memory_prescription(p: dict[str, Any]) -> str:
    """The block the doctor prints first: the option that fits with its measured time cost, or that nothing fits."""
    head = f"prescription, memory budget {p['budget_mb']:g} MB ({p['measure']}), first: a step that does not fit " \
           "never runs"
    if not p["fits"]:
        return f"{head}:\n  nothing fits: {p['why']}"
    if not p["options"] and not p.get("batch"):
        return (f"{head}:\n  the budget-free configuration fits (peak {p['peak_mb']:.4g} MB): no memory lever "
                "needed")
    tries = p["search"]["try_steps"] if p.get("search") else "?"
    cost = (f"{p['step_time_ratio']:.2f}x the time per step ({tries}-step tries, no interval)"
            if p.get("step_time_ratio") is not None else "step time not measured")
    line = (f"  1. {p['option']:<17} peak {p['peak_mb']:.4g} MB (budget-free {p['baseline_peak_mb']:.4g} MB), "
            f"{cost}")
    if p.get("batch"):
        line += (f"; batch {p['batch']['from']} -> {p['batch']['to']}: nothing kept the batch and fit (the effective "
                 "batch changes, lr not rescaled)")
    flags = " ".join(([f"--techniques {','.join(p['options'])},..."] if p["options"] else [])
                     + ([f"--batch-size {p['batch']['to']}"] if p.get("batch") else []))
    return (f"{head}:\n{line}\n  the speed prescription below was ranked without it: stack its picks on "
            f"{p['option']} (`{flags}`)")


__all__ = ["format_memory_prescription", "memory_prescription"]
