"""Predicted vs measured: the map's prediction for a workload beside what its ablation then measured.

The map predicts a technique's speedup at a model's size before anything is run (:mod:`.place`); an ablation
(``lab.ablation.summarize``) then measures the step and inference speedups of the same techniques on that
model. This puts the two side by side, one row per arm and axis, so a user (and the notebook) sees how far the
map can be trusted for their model. Arms and map rows share one vocabulary (:data:`lab.registry.OPTIONS`), so
an arm is matched to the map's row of the same name; an arm the map does not time (``prune50``'s masks,
``int8_dynamic``'s PT2E dynamic flow) gets no prediction rather than the nearest technique's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.crossover.place import place_workload
from lab.registry import OPTIONS

#: The map's axis -> the ablation table's speedup column.
AXIS_COLUMN = {"train_step": "step_speedup", "inference": "infer_speedup"}


def applies(technique: str, axis: str) -> bool:
    """Whether a map row of ``technique`` (an option or a ``+``-joined stack) can change ``axis`` in a run (its
    options' axes, :data:`lab.registry.OPTIONS`): pruning is applied after training, so it is never predicted on
    the training step. A name that is no registered option is kept, and so is every inference prediction (the map
    runs a precision's inference in that precision; the ablation's does not)."""
    parts = [OPTIONS.get(p) for p in technique.split("+") if p in OPTIONS]
    return axis != "train_step" or not parts or any(axis in o.axes for o in parts)


def predicted_vs_measured(the_map: dict[str, Any], table: Any, workload: str, *, size: str = "small",
                          model_scale: str | None = None) -> list[dict[str, Any]]:
    """Rows ``arm, technique, axis, predicted, measured, measured_lo, measured_hi, agrees`` for every arm of
    ``table`` (``summarize``'s DataFrame, or a list of its row dicts) that the map knows. ``agrees``: the
    predicted speedup lies inside the measured 95 % CI (``None`` without a measurement)."""
    placed = place_workload(the_map, workload, size=size, model_scale=model_scale)
    pred = {(p["technique"], p["axis"]): p["predicted_speedup"] for p in placed["predictions"]}
    records = table.to_dict("records") if hasattr(table, "to_dict") else list(table)
    out = []
    for rec in records:
        tech = rec.get("arm")
        for axis, col in AXIS_COLUMN.items():
            if tech is None or (tech, axis) not in pred:
                continue
            value, lo, hi = rec.get(col), rec.get(f"{col}_lo"), rec.get(f"{col}_hi")
            measured = value if isinstance(value, (int, float)) and value == value else None
            bounded = all(isinstance(b, (int, float)) and b == b for b in (lo, hi))  # NaN: fewer than 3 runs
            inside = None if measured is None or not bounded else bool(lo <= pred[(tech, axis)] <= hi)
            out.append({"arm": rec["arm"], "technique": tech, "axis": axis, "predicted": pred[(tech, axis)],
                        "measured": measured, "measured_lo": lo, "measured_hi": hi, "agrees": inside})
    return out


def versus_lines(table: Any, workload: str, path: Path, *, size: str = "small",
                 model_scale: str | None = None) -> list[str]:
    """``lab ablate``'s lines: per arm and axis it competes on, the map at ``path`` predicted vs measured;
    one line saying why when there is no map, the model cannot be placed, or no arm has a counterpart."""
    from lab.crossover import load_map

    try:
        rows = predicted_vs_measured(load_map(path), table, workload, size=size,
                                     model_scale=model_scale) if path.exists() else None
    except (OSError, ValueError) as exc:
        return [f"predicted vs measured: {exc}"]
    competes = {a: str(x).split(",") for a, x in zip(table["arm"], table["axes"], strict=True)}
    rows = None if rows is None else [r for r in rows if r["axis"] in competes.get(r["arm"], [])]
    if not rows:
        return ["predicted vs measured: " + ("no arm has a counterpart on the map" if rows is not None else
                                             f"no crossover map for this hardware id at {path}")]
    out = []
    for r in rows:
        ci = (f" [{r['measured_lo']:.2f}, {r['measured_hi']:.2f}]" if r["measured_lo"] == r["measured_lo"] and
              r["measured_lo"] is not None else " (no interval)")
        out.append(f"map predicted {r['arm']} ({r['axis']}) x{r['predicted']:.2f}; measured "
                   + ("n/a" if r["measured"] is None else f"x{r['measured']:.2f}{ci}"))
    return out
