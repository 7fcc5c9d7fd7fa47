"""The map's headline: the figures ``python -m lab bench`` reports, and the crossovers as sentences.

Goals (issue 15) hold at the largest *dense* rung, the Transformer's (matmuls, like the plain-PyTorch MLP the
targets were measured on): bf16 training step >= 1.8x, dynamic int8 inference >= 2.5x, half-width channel
pruning >= 0.75 x its MACs ratio; and the predicted crossover within one rung of the measured one for >= 75 %
of the workload x technique x axis pairs. Other workloads' figures are reported without a goal.
"""

from __future__ import annotations

import re
from typing import Any

from lab.crossover.mapping import agreement

GOAL_WORKLOAD = "transformer"
TARGETS = {("bf16", "train_step"): 1.8, ("dynamic_int8", "inference"): 2.5}
PRUNE_SHARE_OF_MACS_RATIO = 0.75
AGREEMENT_GOAL = 0.75
_MACS_RATIO = re.compile(r"([0-9.]+)x fewer MACs")


def _largest(rows: list[dict[str, Any]], workload: str, technique: str, axis: str) -> dict[str, Any] | None:
    got = [r for r in rows if r["workload"] == workload and r["technique"] == technique and r["axis"] == axis
           and r["speedup"] is not None]
    return max(got, key=lambda r: r["params"], default=None)


def _figure(name: str, value: float | None, *, unit: str = "x", ci: list[float] | None = None,
            goal: str | None = None, met: bool | None = None, note: str = "") -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "ci95": ci, "goal": goal, "met": met, "note": note,
            "family": "crossover"}


def figures(the_map: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark figures (the envelope ``lab bench`` reads): agreement, then per workload the largest
    measured rung's speedup of each technique x axis, goals on the Transformer's."""
    rows = the_map["rows"]
    ok, n = agreement(the_map["crossovers"])
    out = [_figure("crossover predicted within one rung of measured", ok / n if n else None, unit="share",
                   goal=f">= {AGREEMENT_GOAL:.0%}", met=(ok / n >= AGREEMENT_GOAL) if n else None,
                   note=f"{ok} of {n} workload x technique x axis pairs")]
    pairs = sorted({(r["workload"], r["technique"], r["axis"]) for r in rows})
    for wl, tech, axis in pairs:
        r = _largest(rows, wl, tech, axis)
        if r is None:
            continue
        goal, met = None, None
        if wl == GOAL_WORKLOAD and (tech, axis) in TARGETS:
            goal, met = f">= {TARGETS[(tech, axis)]:g}x", r["speedup"] >= TARGETS[(tech, axis)]
        match = _MACS_RATIO.search(r.get("why") or "")
        if wl == GOAL_WORKLOAD and tech == "prune50" and match:
            need = PRUNE_SHARE_OF_MACS_RATIO * float(match.group(1))
            goal, met = f">= {need:.2f}x (0.75 x its MACs ratio)", r["speedup"] >= need
        out.append(_figure(f"{wl} {r['rung']} ({r['params'] / 1e6:.2g} M params) {tech} {axis.replace('_', ' ')}",
                           r["speedup"], ci=[r["ci_lo"], r["ci_hi"]], goal=goal, met=met,
                           note=(r.get("regime") or "") + (f"; base {r['base_ms']:.3g} ms" if r["base_ms"] else "")))
    return out


def _size(params: float | None) -> str:
    if params is None:
        return "never on this ladder"
    if params <= 0:
        return "any size"
    return f"{params / 1e6:.2g} M" if params >= 1e5 else f"{params / 1e3:.3g} k"


def headline_lines(the_map: dict[str, Any]) -> list[str]:
    """One line per workload x technique x axis: measured crossover (params), predicted, agreement."""
    lines = []
    for c in the_map["crossovers"]:
        lines.append(f"{c['workload']:<12} {c['technique']:<16} {c['axis']:<10} measured from "
                     f"{_size(c['measured_params']):<22} predicted from {_size(c['predicted_params']):<22}"
                     + ("" if c.get("within_one_rung") is None else
                        ("  (within one rung)" if c["within_one_rung"] else "  (more than one rung apart)")))
    ok, n = agreement(the_map["crossovers"])
    lines.append(f"predicted within one rung of measured: {ok} of {n} pairs")
    return lines
