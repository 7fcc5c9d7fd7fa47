"""The ablation's tables as a person reads them: readable column names with units, 2-3 significant
digits, each interval next to its estimate ("1.24x [1.05, 1.40]"), "n = 1: no interval" instead of a
zero-width one, an axis the arm cannot change as "does not apply", an arm the capability gate refused
before training (:class:`lab.precision.NotApplicable`) as "does not apply here" with its reason, and the
"why" as sentences under the table rather than a column. The raw table (``summarize``'s, all 36 columns at
full precision) stays the CSV download.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from lab.ablation.summary import AA_ARM, SPEED_AXIS
from lab.plots.common import ci_text
from lab.precision import not_applicable_reason

#: Readable names of the speed columns.
SPEED_NAMES = {"train_speedup": "Training speedup", "step_speedup": "Step speedup",
               "infer_speedup": "Inference speedup"}
AXIS_NAMES = {"train_step": "training step", "train": "training", "inference": "inference", "size": "size"}


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def _sig(x: Any, digits: int = 3, unit: str = "") -> str:
    v = _num(x)
    return "" if math.isnan(v) else f"{v:.{digits}g}{unit}"


def _text(x: Any) -> str:
    """A text cell's value; a missing one (None, or NaN for an arm with no finished run) is empty."""
    return x if isinstance(x, str) else ""


def _speed(row: pd.Series, col: str) -> str:
    if not_applicable_reason(row.get("error")):
        return "does not apply here"
    if SPEED_AXIS[col] not in _text(row.get("axes")).split(","):
        return "does not apply"
    est = _num(row.get(col))
    if math.isnan(est):
        return ""
    if row["arm"] == "baseline":
        return "1x (reference)"
    text = ci_text(est, _num(row.get(f"{col}_lo")), _num(row.get(f"{col}_hi")), "x")
    n = int(_num(row.get("n_ok")) or 0) if not math.isnan(_num(row.get("n_ok"))) else 0
    if "no interval" in text and row["arm"] != "baseline":
        return f"{est:.3g}x (n = {n}: no interval)"
    return text


def _loss(row: pd.Series) -> str:
    est = _num(row.get("acc_loss_pt"))
    if math.isnan(est):
        return ""
    unit = " pt" if str(row.get("loss_unit") or "pt") in ("pt", "points", "nan", "") else f" {row.get('loss_unit')}"
    lo, hi = _num(row.get("acc_loss_lo")), _num(row.get("acc_loss_hi"))
    if math.isnan(lo) or math.isnan(hi):
        return f"{est:+.2g}{unit}" + ("" if row["arm"] == "baseline" else " (no interval)")
    return f"{est:+.2g}{unit} [{lo:+.2g}, {hi:+.2g}]"


def ablation_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per arm, humanised (see the module docstring)."""
    rows = []
    metric_name = next((m for m in df.get("metric_name", []) if _text(m)), "metric")  # an arm without runs has none
    for _, r in df.iterrows():
        arm = str(r["arm"])
        rows.append({
            "Arm": "A/A (baseline again: noise floor)" if arm == AA_ARM else arm,
            "Techniques": ", ".join(r["techniques"]) if isinstance(r.get("techniques"), (list, tuple))
            else str(r.get("techniques") or "none"),
            "Competes on": ", ".join(AXIS_NAMES.get(a, a) for a in _text(r.get("axes")).split(",") if a),
            "Runs ok": f"{int(_num(r.get('n_ok')) or 0)}/{int(_num(r.get('n_runs')) or 0)}"
            if not math.isnan(_num(r.get("n_runs"))) else "",
            **{f"{name} (x, 95 % CI)": _speed(r, col) for col, name in SPEED_NAMES.items()},
            f"Accuracy loss ({metric_name}, 95 % CI)": _loss(r),
            "Seed noise (pt)": _sig(r.get("noise_pt"), 2),
            "Size (x smaller)": _sig(r.get("size_ratio"), 3, "x"),
            "MACs (x fewer)": _sig(r.get("macs_ratio"), 3, "x"),
            "Peak memory (MB)": _sig(r.get("peak_memory_mb"), 3),
            "Training time (s)": _sig(r.get("train_time_s"), 3),
            "Status": "does not apply here" if not_applicable_reason(r.get("error")) else str(r.get("status") or ""),
        })
    out = pd.DataFrame(rows)
    if len(out.columns):
        metric_col = next(c for c in out.columns if c.startswith("Accuracy loss"))
        out = out.rename(columns={metric_col: "Accuracy loss (95 % CI)"})
    return out.loc[:, [c for c in out.columns if (out[c] != "").any()]] if len(out) else out


def why_lines(df: pd.DataFrame) -> list[str]:
    """One sentence per arm with "why" tags: what the measurement says about its speed or accuracy. The
    same tag from several runs (differing only in its measured numbers) is said once, with its count."""
    out = []
    for _, r in df.iterrows():
        refused = not_applicable_reason(r.get("error"))
        if refused:
            out.append(f"**{r['arm']}** does not apply here (refused before training): {refused}")
            continue
        why = str(r.get("why") or "").strip()
        if not why or why == "nan":
            continue
        said: dict[str, tuple[str, int]] = {}
        for tag in (w.strip() for w in why.split(";")):
            if tag:
                key = re.sub(r"\([^)]*\)", "", tag).strip()
                first, n = said.get(key, (tag, 0))
                said[key] = (first, n + 1)
        out.append(f"**{r['arm']}**: " + "; ".join(t + (f" (in {n} runs; numbers from the first)" if n > 1 else "")
                                                     for t, n in said.values()))
    return out


def effects_table(effects: pd.DataFrame) -> pd.DataFrame:
    """The factorial effects, humanised: term, techniques, speed effect with its CI, verdict, accuracy effect."""
    terms = {"main": "main effect", "2-way": "2-way interaction", "3-way": "3-way interaction"}
    return pd.DataFrame([{
        "Term": terms.get(e["term"], e["term"]),
        "Techniques": str(e["techniques"]).replace("+", " + "),
        "Speed effect (x, 95 % CI)": ci_text(_num(e["effect"]), _num(e["effect_lo"]), _num(e["effect_hi"]), "x"),
        "Reads as": e["verdict"],
        "Accuracy effect (pt)": _sig_signed(e["loss_effect_pt"]),
    } for _, e in effects.iterrows()])


def _sig_signed(x: Any) -> str:
    v = _num(x)
    return "" if math.isnan(v) else f"{v:+.2g}"
