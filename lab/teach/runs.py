"""The runs a notebook's study stored, fetched back for its side-by-side table
(:func:`lab.plots.tables.technique_table`).

Why here: ``lab.doctor.verify`` returns predicted-vs-measured rows, not the runs behind them, and a notebook that
reached into the store by hand would carry the ablation's labelling scheme in a cell. This rebuilds the same
ablation (:func:`lab.recipes.from_techniques`, deterministic in its arms) and reads each arm's runs back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from lab.doctor.diagnosis import Diagnosis
from lab.recipes import from_techniques
from lab.result import RunResult
from lab.store import ResultStore


def verification_runs(d: Diagnosis, rows: Sequence[dict[str, Any]], repeats: int,
                      store: ResultStore) -> dict[str, list[RunResult]]:
    """Each arm of the ablation ``lab.doctor.verify(d, ..., repeats=repeats, store=store)`` ran (the baseline
    first, one arm per verified technique in ``rows``' order, the A/A arm): its stored ``ok`` runs, every
    repeat; an arm with none (refused, failed) is left out."""
    base = dataclasses.replace(d.cfg, profile=False)
    ablation = from_techniques("doctor", base, [[r["technique"]] for r in rows])
    got = {arm: [r for rep in range(repeats) for r in store.list_results(label=ablation.label(arm, rep), status="ok")]
           for arm in ablation.arms}
    return {arm: runs for arm, runs in got.items() if runs}


__all__ = ["verification_runs"]
