"""Shared plumbing for benchmarks: the ``--quick`` / ``--json`` flags, the figure helpers and the JSON envelope.

Every benchmark writes ``{"benchmark", "quick", "env", "figures": [...]}``; each figure carries its
value, its CI where it has one, the goal it is held against and whether it met it, so a report can be
rendered without re-reading the benchmark's code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lab.measure import bootstrap_ratio_ci, environment_stamp, median  # noqa: E402
from lab.result import to_jsonable  # noqa: E402


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """``--quick`` and ``--json``, plus whatever ``extra`` adds (a benchmark's own modes)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="short setting (well under a minute)")
    p.add_argument("--json", metavar="PATH", help="write the figures here")
    if extra is not None:
        extra(p)
    return p.parse_args()


def figure(name: str, value: float, *, unit: str, goal: str | None = None, met: bool | None = None,
           ci: tuple[float, float] | None = None, note: str = "", family: str | None = None) -> dict[str, Any]:
    """One measured figure. ``family`` (data, precision, pruning, quantization, distributed, ...) tells the report
    which anchor to compare it with; without it the report uses the benchmark's own name."""
    return {"name": name, "value": value, "unit": unit, "ci95": list(ci) if ci else None, "goal": goal,
            "met": met, "note": note, "family": family}


def skipped(name: str, why: str, family: str, unit: str = "x") -> dict[str, Any]:
    """A figure that could not be measured here: NaN with the reason, so a report can say why."""
    return figure(name, float("nan"), unit=unit, note=f"skipped: {why}", family=family)


def ratio_figure(name: str, base: Sequence[float], variant: Sequence[float], *, family: str,
                 goal_min: float | None = None, goal: str | None = None, note: str = "") -> dict[str, Any]:
    """Speedup ``median(base) / median(variant)`` with its bootstrap 95 % CI; ``goal_min`` sets the goal."""
    est, lo, hi = bootstrap_ratio_ci(base, variant)
    if goal_min is not None and goal is None:
        goal = f">= {goal_min:g}x"
    return figure(name, est, unit="x", ci=(lo, hi), goal=goal, met=(est >= goal_min) if goal_min else None,
                  note=note, family=family)


def median_figure(name: str, samples: Sequence[float], *, family: str, unit: str = "ms",
                  note: str = "") -> dict[str, Any]:
    """The median of timing samples, with how many blocks it came from in the note."""
    return figure(name, median(samples), unit=unit, note=f"{len(samples)} blocks; {note}".rstrip("; "),
                  family=family)


def emit(benchmark: str, args: argparse.Namespace, figures: list[dict[str, Any]], **extra: Any) -> None:
    """Print the figures as a table and, with ``--json``, write the envelope."""
    for f in figures:
        ci = f" [{f['ci95'][0]:.4g}, {f['ci95'][1]:.4g}]" if f["ci95"] else ""
        verdict = "undefined" if f["met"] is None else "met" if f["met"] else "NOT met"
        goal = f"  goal {f['goal']}: {verdict}" if f["goal"] else ""
        print(f"{f['name']:<44} {f['value']:>10.4g} {f['unit']}{ci}{goal}")
    if args.json:
        out = {"benchmark": benchmark, "quick": args.quick, "env": environment_stamp(),
               "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
               # 1 / 5 / 15-minute load averages when written: how busy the machine was (noise), not a figure
               "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
               "figures": figures, **extra}
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(to_jsonable(out), indent=2))
        print(f"wrote {path}")
