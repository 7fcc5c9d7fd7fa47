"""The full run, projected (:func:`lab.ablation.project.projection_rows`): per arm its parts stacked (training
steps, evaluations, one-off costs) with the whole run's 95 % interval as a whisker, and the same rows as a table a
person reads (three significant digits, the interval beside its figure, no snake_case). The Full run tab drew
Streamlit's bare bar chart (no whiskers; a long arm name cut to "prune50+int8_ea...") and the rows at 4 decimals."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from lab.plots.common import fig_title

#: The parts of a run, bottom to top, and their colours (colour-blind safe).
PARTS = (("training steps", "#0072B2"), ("evaluations", "#E69F00"), ("one-off costs", "#CC79A7"))


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _sig(x: Any, digits: int = 3) -> str:
    v = _num(x)
    return "" if math.isnan(v) else f"{v:.{digits}g}"


def full_run_bars(rows: Sequence[Mapping[str, Any]], unit: str) -> go.Figure:
    """Stacked parts per arm, the whole run's interval as a whisker on top of each bar."""
    arms = [str(r["arm"]) for r in rows]
    fig = go.Figure()
    for i, (part, colour) in enumerate(PARTS):
        values = [_num(r.get(f"{part} ({unit})")) for r in rows]
        last = i == len(PARTS) - 1
        totals = [_num(r.get(f"full run ({unit})")) for r in rows]
        error = dict(type="data", symmetric=False, color="#333333", thickness=1.5, width=6,
                     array=[_num(r.get("hi")) - t for r, t in zip(rows, totals, strict=True)],
                     arrayminus=[t - _num(r.get("lo")) for r, t in zip(rows, totals, strict=True)]) if last else None
        fig.add_bar(name=part, x=arms, y=values, marker_color=colour, error_y=error,
                    hovertemplate=f"%{{x}}: {part} %{{y:.3g}} {unit}<extra></extra>")
    fig.update_layout(barmode="stack", height=420, margin=dict(t=70, b=40),
                      title=fig_title(f"Full run per arm ({unit})", "stacked parts; whisker: the whole run's 95 % "
                                      "interval over the ablation's runs"),
                      yaxis_title=f"full run ({unit})", legend=dict(orientation="h", y=-0.25),
                      xaxis=dict(tickangle=0, automargin=True))
    return fig


def projection_table(rows: Sequence[Mapping[str, Any]], unit: str) -> pd.DataFrame:
    """The rows humanised: the full run with its interval, its parts and the peak memory at 3 significant digits."""
    out = []
    for r in rows:
        lo, hi = _num(r.get("lo")), _num(r.get("hi"))
        ci = "" if math.isnan(lo) or math.isnan(hi) or f"{lo:.3g}" == f"{hi:.3g}" else f" [{lo:.3g}, {hi:.3g}]"
        out.append({"Arm": str(r["arm"]), f"Full run ({unit}, 95 % CI)": _sig(r.get(f"full run ({unit})")) + ci,
                    **{f"{part.capitalize()} ({unit})": _sig(r.get(f"{part} ({unit})")) for part, _ in PARTS},
                    "Peak memory (MB)": _sig(r.get("peak memory (MB)")), "Runs": _sig(r.get("runs"), 6),
                    "Steps": _sig(r.get("steps"), 9)})
    return pd.DataFrame(out)
