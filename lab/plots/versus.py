"""Predicted vs measured for an ablation: what the crossover map of this machine predicted for each arm at the
model's size (before the ablation ran), against the speedup the ablation then measured, with its 95 % CI.

Why side by side: a map is only worth consulting if its predictions land inside what is later measured; a
user sees per arm and axis whether it did ("agrees": the prediction lies inside the measured CI). The rows
come from :func:`lab.crossover.predicted_vs_measured`; the dashboard's Ablation and Stored-runs tabs draw them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from lab.plots.common import fig_title

AXIS_LABELS = {"train_step": "training step", "inference": "inference"}
_SYMBOLS = {"train_step": "circle", "inference": "diamond"}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def agrees(row: Mapping[str, Any]) -> bool | None:
    """The predicted speedup lies inside the measured 95 % CI; ``None`` without an interval (below 3 runs the
    table's bounds are NaN, which is no interval, not a disagreement)."""
    lo, hi, pred = row.get("measured_lo"), row.get("measured_hi"), row.get("predicted")
    if not (_finite(lo) and _finite(hi) and _finite(pred) and _finite(row.get("measured"))):
        return None
    return bool(lo <= pred <= hi)


_AGREES_TEXT = {True: "yes", False: "no", None: "no interval"}


def versus_figure(rows: Sequence[Mapping[str, Any]], *, title: str = "Predicted by the map vs measured",
                  height: int = 420) -> go.Figure:
    """Predicted speedup (x) against measured speedup (y, 95 % CI whisker), one marker per arm x axis, the
    identity line (on it the map was right) and 1x on both axes; hover shows the arm, axis and figures."""
    fig = go.Figure()
    pts = [r for r in rows if _finite(r.get("measured")) and _finite(r.get("predicted"))]
    for axis in [a for a in AXIS_LABELS if any(r["axis"] == a for r in pts)]:
        on = [r for r in pts if r["axis"] == axis]
        lo = [r["measured"] - r["measured_lo"] if _finite(r.get("measured_lo")) else 0.0 for r in on]
        hi = [r["measured_hi"] - r["measured"] if _finite(r.get("measured_hi")) else 0.0 for r in on]
        ci = [f"[{r['measured_lo']:.3g}, {r['measured_hi']:.3g}]"
              if _finite(r.get("measured_lo")) and _finite(r.get("measured_hi")) else "no interval" for r in on]
        fig.add_scatter(
            name=AXIS_LABELS[axis], mode="markers+text", text=[r["arm"] for r in on], textposition="top center",
            x=[r["predicted"] for r in on], y=[r["measured"] for r in on],
            marker={"symbol": _SYMBOLS[axis], "size": 11},
            error_y={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
            customdata=[[r["arm"], r["technique"], c, _AGREES_TEXT[agrees(r)]] for r, c in zip(on, ci, strict=True)],
            hovertemplate=("arm %{customdata[0]} (map: %{customdata[1]}), " + AXIS_LABELS[axis]
                           + "<br>predicted %{x:.3g}x<br>measured %{y:.3g}x %{customdata[2]}"
                           + "<br>agrees: %{customdata[3]}<extra></extra>"))
    vals = [v for r in pts for v in (r["predicted"], r["measured"], r.get("measured_lo"), r.get("measured_hi"))
            if _finite(v)] or [1.0]
    lo_v, hi_v = min(min(vals), 1.0) * 0.9, max(max(vals), 1.0) * 1.1
    fig.add_scatter(x=[lo_v, hi_v], y=[lo_v, hi_v], mode="lines", line={"dash": "dot", "color": "grey"},
                    name="predicted = measured", hoverinfo="skip")
    fig.add_hline(y=1.0, line_width=1, line_color="#bbbbbb")
    fig.add_vline(x=1.0, line_width=1, line_color="#bbbbbb")
    fig.update_layout(title=fig_title(title, "map's prediction at this model's size; measured with its 95 % CI"),
                      xaxis_title="predicted speedup (x)", yaxis_title="measured speedup (x)", height=height,
                      margin={"t": 70})
    return fig


def versus_table(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The rows as a person reads them: arm, axis, predicted, measured with its CI, agrees."""
    def measured(r: Mapping[str, Any]) -> str:
        if not _finite(r.get("measured")):
            return "not measured"
        if _finite(r.get("measured_lo")) and _finite(r.get("measured_hi")):
            return f"{r['measured']:.3g}x [{r['measured_lo']:.3g}, {r['measured_hi']:.3g}]"
        return f"{r['measured']:.3g}x (no interval)"

    return pd.DataFrame([{
        "Arm": r["arm"], "Map technique": r["technique"], "Axis": AXIS_LABELS.get(r["axis"], r["axis"]),
        "Predicted (x)": f"{r['predicted']:.3g}x" if _finite(r.get("predicted")) else "",
        "Measured (x, 95 % CI)": measured(r),
        "Agrees": _AGREES_TEXT[agrees(r)],
    } for r in rows], columns=["Arm", "Map technique", "Axis", "Predicted (x)", "Measured (x, 95 % CI)", "Agrees"])


__all__ = ["agrees", "versus_figure", "versus_table"]
