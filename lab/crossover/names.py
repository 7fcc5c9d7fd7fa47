"""A stored map read in today's vocabulary: every technique name through :data:`lab.registry.OLD_MAP_NAMES`.

Why on load and not on disk: committed maps are measurements taken at a commit, and rewriting them would make
them claim a vocabulary they were not written in. Every reader (:func:`lab.crossover.load_map`, the report's
:func:`lab.crossover.report.load_maps`, the doctor, the dashboard) goes through :func:`in_current_names`, so a
row is always named by the option (:data:`lab.registry.OPTIONS`) that a recipe, an ablation arm and the doctor
use for the same technique.
"""

from __future__ import annotations

import copy
from typing import Any

from lab.registry import OLD_MAP_NAMES

#: The map's parts whose records carry a ``technique``.
NAMED_PARTS = ("rows", "crossovers", "fits", "reference")


def current_name(name: str) -> str:
    """Today's name of a technique or a ``+``-joined stack stored under an old one (unchanged if current)."""
    if name in OLD_MAP_NAMES:
        return OLD_MAP_NAMES[name]
    return "+".join(OLD_MAP_NAMES.get(part, part) for part in name.split("+")) if "+" in name else name


def in_current_names(the_map: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``the_map`` with every record's ``technique`` in today's names (the input is not changed)."""
    out = copy.copy(the_map)
    for part in NAMED_PARTS:
        if isinstance(the_map.get(part), list):
            out[part] = [{**r, "technique": current_name(r["technique"])} if isinstance(r, dict) and
                         isinstance(r.get("technique"), str) else r for r in the_map[part]]
    return out


__all__ = ["NAMED_PARTS", "current_name", "in_current_names"]
