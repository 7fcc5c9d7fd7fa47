"""Predicted vs measured: the map's prediction for a workload beside what its ablation then measured.

The map predicts a technique's speedup at a model's size before anything is run (:mod:`.place`); an ablation
(``lab.ablation.summarize``) then measures the step and inference speedups of the same techniques on that
model. This puts the two side by side, one row per arm and axis, so a user (and the notebook) sees how far the
map can be trusted for their model. Arm names are the technique registry's (``lab.recipes.TECHNIQUES``); the
map's names differ where the map measures something narrower (its ``prune50`` removes channels; the
registry's ``prune50`` is L1 masks, so ``prune_channels50`` is its counterpart).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.crossover.place import place_workload

#: Ablation arm (a technique of ``lab.recipes``) -> the map's technique.
#: ``int8_static`` runs the default flow, PT2E compiled, so its counterpart is ``pt2e_static_int8`` (the map's
#: ``static_int8`` is the legacy eager flow; a map without PT2E rows makes no prediction for it, not a wrong one).
ARM_TO_TECHNIQUE = {"bf16": "bf16", "fp16": "fp16", "amp_auto": "auto", "int8_dynamic": "dynamic_int8",
                    "int8_eager": "dynamic_int8", "int8_static": "pt2e_static_int8", "prune_channels50": "prune50",
                    "compile": "compile", "fused_optim": "fused_optimizer", "workers2": "workers"}
#: The map's axis -> the ablation table's speedup column.
AXIS_COLUMN = {"train_step": "step_speedup", "inference": "infer_speedup"}


def applies(technique: str, axis: str) -> bool:
    """Whether the map's ``technique`` can change ``axis`` (its registry counterparts' axes,
    ``lab.registry.TECHNIQUES``, filled by ``lab.recipes``): pruning is applied after training, so it is never
    predicted on the training step. A technique without a registered counterpart is kept, and so is every
    inference prediction (the map runs a precision's inference in that precision; the ablation's does not)."""
    from lab.registry import TECHNIQUES

    arms = [a for a, t in ARM_TO_TECHNIQUE.items() if t == technique and a in TECHNIQUES]
    return axis != "train_step" or not arms or any(axis in TECHNIQUES[a].axes for a in arms)


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
        tech = ARM_TO_TECHNIQUE.get(rec.get("arm"))
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
