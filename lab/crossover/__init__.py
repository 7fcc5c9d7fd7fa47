"""Where does it pay? Each technique's speedup against model size on this machine.

The lab's verdicts on its small built-in models are verdicts about dispatch overhead, not about the hardware:
the same technique that loses at 50 k parameters can win at 5 M. This package measures the training step and
the inference call of every workload's size ladder (``Workload.scales``) with and without each technique
(:mod:`.arms`, :mod:`.measure`: interleaved, repeated, bootstrap CIs), fits ``time = overhead + cost x MACs``
per workload x technique x axis and reads off the crossover (:mod:`.fit`), tags each rung dispatch-,
memory- or compute-bound with its evidence, writes the map (:mod:`.mapping`) and places any model on it
(:mod:`.place`); the map at 1 thread against all cores and loader workers along the ladder (:mod:`.threads`,
:mod:`.threads_study`). CLI ``python -m lab crossover``; benchmark ``benchmarks/crossover.py``; notebook
``notebooks/07_scale.ipynb``; dashboard page "Where does it pay?".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.crossover.arms import AXES, TECHNIQUES
from lab.crossover.fit import Line, crossover_macs, fit_line, loo_error, predicted_speedup, regime
from lab.crossover.mapping import (
    CROSSOVER_KEYS,
    FIT_KEYS,
    MAP_WORKLOADS,
    QUICK_TECHNIQUES,
    ROW_KEYS,
    agreement,
    analyse,
    build_map,
    check_names,
)
from lab.crossover.names import current_name, in_current_names
from lab.crossover.place import describe, family_of, place, place_model, place_workload
from lab.crossover.report import cross_hardware_table, figures, headline_lines, load_maps, write_strict_json
from lab.crossover.threads import compare_maps, stops_paying, workers_along_ladder
from lab.crossover.threads_study import load_study, summary_lines, threads_study, write_study
from lab.crossover.versus import predicted_vs_measured

__all__ = ["AXES", "CROSSOVER_KEYS", "FIT_KEYS", "Line", "MAP_WORKLOADS", "QUICK_TECHNIQUES", "ROW_KEYS", "TECHNIQUES",
           "agreement", "analyse", "build_map", "check_names", "check_schema", "compare_maps", "cross_hardware_table",
           "crossover_macs", "current_name", "describe", "family_of", "figures", "fit_line", "headline_lines",
           "in_current_names", "load_map", "load_maps",
           "load_study", "loo_error",
           "place", "place_model", "place_workload", "predicted_speedup", "predicted_vs_measured", "regime",
           "stops_paying", "summary_lines", "threads_study", "workers_along_ladder", "write_map",
           "write_study"]


def check_schema(the_map: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first missing key of the map's JSON schema (``lab doctor`` and the
    dashboard read those keys)."""
    for key in ("env", "rows", "crossovers", "fits"):
        if key not in the_map:
            raise ValueError(f"crossover map lacks {key!r}")
    for part, keys in (("rows", ROW_KEYS), ("crossovers", CROSSOVER_KEYS), ("fits", FIT_KEYS)):
        for i, rec in enumerate(the_map[part]):
            missing = [k for k in keys if k not in rec]
            if missing:
                raise ValueError(f"crossover map {part}[{i}] lacks {', '.join(missing)}")


def write_map(the_map: dict[str, Any], path: str | Path) -> Path:
    """Write the map as JSON (NaN / inf become null), creating the folder."""
    return write_strict_json({**the_map, "figures": the_map.get("figures") or figures(the_map)}, path)


def load_map(path: str | Path) -> dict[str, Any]:
    """A map written by :func:`write_map` (schema checked), its techniques in today's names
    (:func:`lab.crossover.names.in_current_names`: a map stored under the old names reads the same)."""
    the_map = json.loads(Path(path).read_text())
    check_schema(the_map)
    return in_current_names(the_map)
