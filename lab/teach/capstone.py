"""Notebook 06's closing capstone: the learner's own model, the doctor's pick for it, and the learner's latency /
size / accuracy table held against the lab's runs of the same two arms (the names are re-exported by
:mod:`lab.teach.checks`, which the notebooks import).

Why apart: the capstone checks a whole table of measurements against lab runs, not one small function against a
library call, and :mod:`lab.teach.checks` stays a file a learner can read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

#: The table's columns, in the units the exercise asks for.
COLUMNS = ("latency_ms", "size_mb", "accuracy_pct", "within_budget")
#: How far the learner's figures may sit from the lab's run of the same arm. Size: the same ``torch.save`` of the
#: same layers, up to pickling detail. Accuracy: the recipe file on the lab's batches in order trains the lab's
#: model step for step (tests/core/test_portable.py), so a point is room for rounding, not for a fraction typed
#: as a percent. Latency: another timer at another moment on a shared machine (CI read 1.32 ms against the lab's
#: 0.44 ms for the same baseline, a factor 3.0), so only the units are held: a factor 16 still catches seconds or
#: microseconds (x1000) and a per-row figure (x256), and is no speed test.
SIZE_RTOL, ACCURACY_PT, LATENCY_FACTOR = 0.05, 1.0, 16.0


def _ok(msg: str) -> None:
    print("correct:", msg)


def pick(diagnosis: Any, axis: str = "inference") -> tuple[str, bool]:
    """``(technique, prescribed)``: the doctor's prescription on ``axis``, or, when nothing there pays beyond the
    noise (:data:`lab.doctor.risk.NOTHING_PAYS`), its best-ranked candidate, said as not prescribed."""
    top = diagnosis.top(axis)
    if top is not None:
        return top.technique, True
    ranked = [p for p in diagnosis.predictions if p.axis == axis]
    if not ranked:
        raise ValueError(f"the diagnosis has no prediction on {axis!r}: give it techniques that act there")
    return ranked[0].technique, False


def lab_row(result: Any) -> dict[str, float]:
    """The lab's figures of one run, in the table's units: median latency of a 256-row batch (ms), the
    ``torch.save`` size of the model it ends with (MB), test accuracy (%)."""
    lat = result.latency_ms.get("batch_256") or []
    return {"latency_ms": float(pd.Series(lat).median()) if lat else float("nan"),
            "size_mb": result.model_bytes / 1e6, "accuracy_pct": 100 * result.metric}


def verdict(rows: Mapping[str, Mapping[str, float]], baseline: str, acc_budget_pt: float,
            size_budget_mb: float) -> dict[str, bool]:
    """Per arm: within budget when its accuracy is at most ``acc_budget_pt`` below the baseline's and its size at
    most ``size_budget_mb``."""
    base = rows[baseline]["accuracy_pct"]
    return {arm: bool(base - r["accuracy_pct"] <= acc_budget_pt and r["size_mb"] <= size_budget_mb)
            for arm, r in rows.items()}


def capstone_table(table: pd.DataFrame, lab_runs: Mapping[str, Any], acc_budget_pt: float,
                   size_budget_mb: float) -> pd.DataFrame:
    """The learner's table (one row per arm, :data:`COLUMNS`) held against the lab's runs of the same arms
    (``{arm: RunResult}``, the baseline first): each size within :data:`SIZE_RTOL` of the lab's, each accuracy
    within :data:`ACCURACY_PT` points, each latency within a factor :data:`LATENCY_FACTOR`, and each
    ``within_budget`` what the table's own figures say under the budget. Returns the lab's table beside it."""
    arms = list(lab_runs)
    missing = [c for c in COLUMNS if c not in table.columns]
    assert not missing, f"the table lacks columns {missing}: one row per arm with {list(COLUMNS)}"
    assert sorted(map(str, table.index)) == sorted(arms), \
        f"rows {list(table.index)}, the lab ran {arms}: one row per arm, named as the lab names it"
    lab = {arm: lab_row(r) for arm, r in lab_runs.items()}
    for arm in arms:
        mine, ref = table.loc[arm], lab[arm]
        assert abs(mine.size_mb - ref["size_mb"]) <= SIZE_RTOL * ref["size_mb"], (
            f"{arm}: size {mine.size_mb:.4g} MB, the lab's {ref['size_mb']:.4g} MB: bytes of torch.save(model."
            "state_dict()) of the model you would ship, over 1e6")
        assert abs(mine.accuracy_pct - ref["accuracy_pct"]) <= ACCURACY_PT, (
            f"{arm}: accuracy {mine.accuracy_pct:.4g} %, the lab's {ref['accuracy_pct']:.4g} %: the share of the test "
            "set classified right, in percent, of the model you would ship (in eval mode)")
        lo, hi = ref["latency_ms"] / LATENCY_FACTOR, ref["latency_ms"] * LATENCY_FACTOR
        assert lo <= mine.latency_ms <= hi, (
            f"{arm}: latency {mine.latency_ms:.4g} ms, the lab's {ref['latency_ms']:.4g} ms: the median of several "
            "calls on 256 test rows under torch.no_grad(), in milliseconds")
    mine_rows = {arm: {c: float(table.loc[arm, c]) for c in COLUMNS[:3]} for arm in arms}
    want = verdict(mine_rows, arms[0], acc_budget_pt, size_budget_mb)
    got = {arm: bool(table.loc[arm, "within_budget"]) for arm in arms}
    assert got == want, (f"within_budget {got}, your own figures say {want}: an arm is within budget when it loses at "
                         f"most {acc_budget_pt} pt of the baseline's accuracy and weighs at most {size_budget_mb} MB")
    lab_table = pd.DataFrame(lab).T.assign(within_budget=pd.Series(verdict(lab, arms[0], acc_budget_pt,
                                                                           size_budget_mb)))
    _ok(f"{len(arms)} rows within the lab's measurements (size to {SIZE_RTOL:.0%}, accuracy to {ACCURACY_PT} pt, "
        f"latency to x{LATENCY_FACTOR}); within budget: {[a for a, ok in got.items() if ok] or 'none'}")
    return lab_table


__all__ = ["ACCURACY_PT", "COLUMNS", "LATENCY_FACTOR", "SIZE_RTOL", "capstone_table", "lab_row", "pick", "verdict"]
