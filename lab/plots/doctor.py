"""Figures of the doctor (:mod:`lab.doctor`): where a step's time goes by op class, the prescription with
its intervals, and predicted vs measured after verification. Shared by ``notebooks/08_doctor`` and the
dashboard's Doctor page."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from lab.doctor import Prediction
from lab.measure.profile import OP_CLASSES
from lab.plots.common import ratio_bars

CLASS_COLORS = {"matmul": "#1f77b4", "embedding": "#17becf", "recurrent": "#8c564b", "norm": "#bcbd22",
                "elementwise": "#2ca02c", "reduction": "#e377c2", "optimizer": "#9467bd", "data_wait": "#d62728",
                "comm": "#ff7f0e", "overhead": "#7f7f7f", "other": "#c7c7c7"}


def op_class_bars(breakdowns: Mapping[str, Mapping[str, Any]], *, title: str = "Where the step goes") -> go.Figure:
    """One stacked horizontal bar per breakdown (``Breakdown.to_dict()``), ms per op class."""
    fig = go.Figure()
    labels = list(breakdowns)
    for cls in OP_CLASSES:
        xs = [float(b["ms"].get(cls, 0.0)) for b in breakdowns.values()]
        if any(x > 0 for x in xs):
            fig.add_bar(name=cls, y=labels, x=xs, orientation="h", marker_color=CLASS_COLORS[cls],
                        hovertemplate="%{x:.3f} ms<extra>" + cls + "</extra>")
    fig.update_layout(barmode="stack", title=title, xaxis_title="ms per step", height=160 + 60 * len(labels),
                      legend={"orientation": "h", "y": -0.35})
    return fig


def prescription_bars(predictions: Sequence[Prediction], *, title: str = "Predicted speedup") -> go.Figure:
    """Predicted speedups with their intervals, grouped by axis, best first."""
    series: dict[str, list[tuple[str, float, float, float]]] = {}
    for p in predictions:
        series.setdefault(p.axis, []).append((p.technique, p.speedup, p.lo, p.hi))
    return ratio_bars(series, title=title, yaxis_title="predicted speedup (x)")


def predicted_vs_measured(rows: Sequence[Mapping[str, Any]], *, title: str = "Predicted vs measured") -> go.Figure:
    """Each verified technique: predicted (x, with its interval) against measured (y, with its CI); on the
    diagonal the doctor was right."""
    fig = go.Figure()
    pts = [r for r in rows if r.get("measured") is not None]
    for axis in sorted({r["axis"] for r in pts}):
        on = [r for r in pts if r["axis"] == axis]
        fig.add_scatter(
            name=axis, mode="markers+text", text=[r["technique"] for r in on], textposition="top center",
            x=[r["predicted"] for r in on], y=[r["measured"] for r in on],
            error_x={"type": "data", "symmetric": False, "array": [r["predicted_hi"] - r["predicted"] for r in on],
                     "arrayminus": [r["predicted"] - r["predicted_lo"] for r in on]},
            error_y={"type": "data", "symmetric": False,
                     "array": [(r["measured_hi"] or r["measured"]) - r["measured"] for r in on],
                     "arrayminus": [r["measured"] - (r["measured_lo"] or r["measured"]) for r in on]})
    vals = [v for r in pts for v in (r["predicted"], r["measured"])] or [1.0]
    lo, hi = min(min(vals), 1.0) * 0.9, max(max(vals), 1.0) * 1.1
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dot", "color": "grey"}, name="exact",
                    hoverinfo="skip")
    fig.update_layout(title=title, xaxis_title="predicted speedup (x)", yaxis_title="measured speedup (x)",
                      height=420)
    return fig


__all__ = ["CLASS_COLORS", "op_class_bars", "predicted_vs_measured", "prescription_bars"]
