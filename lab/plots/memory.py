"""Memory against time (:mod:`lab.ablation.memory_trade`): each arm (or each try of a budget search) at its
step-time ratio and peak-memory ratio against the baseline, with their 95 % intervals as whiskers where the record
has them, the Pareto front as a line, and the budget as a dashed line when one is given. Lower-left is better on
both axes: a point below the budget line fits, and the cheapest in time of those is what a budget should buy.
Every number (point, whisker, hover) is the trade's row, the one :func:`lab.ablation.memory_trade.from_ablation` or
:func:`~lab.ablation.memory_trade.from_budget` computed."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from lab.plots.common import ci_text, fig_title

#: The colour key: whether a point fits the budget (blue without one); the budget's answer is a star of its own.
FIT_KEY = {True: ("fits the budget", "#009E73"), False: ("over the budget", "#D55E00"),
           None: ("configuration", "#0072B2")}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _whiskers(rows: list[Mapping[str, Any]], est: str, lo: str, hi: str) -> dict[str, Any]:
    plus = [r[hi] - r[est] if _finite(r.get(hi)) and _finite(r.get(est)) else 0.0 for r in rows]
    minus = [r[est] - r[lo] if _finite(r.get(lo)) and _finite(r.get(est)) else 0.0 for r in rows]
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "thickness": 1.2}


def _label(r: Mapping[str, Any]) -> str:
    return "A/A" if r.get("kind") == "aa" else str(r["name"]) + (" (chosen)" if r.get("chosen") else "")


def memory_vs_time(trade: Mapping[str, Any], *, title: str = "Memory vs time") -> go.Figure:
    """The trade's rows as points (x: step-time ratio, y: peak-memory ratio, both against the baseline), one trace
    per colour class so the legend is the key (the budget search's answer a star of its own); the front as a dashed
    black line; the budget, when the trade has one, as a dashed orange line at its ratio of the baseline's peak."""
    rows = [r for r in trade["rows"] if _finite(r.get("peak_ratio")) and _finite(r.get("time_ratio"))]
    fig = go.Figure()
    fig.add_vline(x=1.0, line_dash="dot", line_color="grey")
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    front = sorted((r for r in rows if r.get("front")), key=lambda r: (r["time_ratio"], r["peak_ratio"]))
    if len(front) > 1:
        fig.add_scatter(x=[r["time_ratio"] for r in front], y=[r["peak_ratio"] for r in front], mode="lines",
                        name="Pareto front", line={"color": "black", "dash": "dash", "shape": "hv"},
                        hoverinfo="skip")
    above = {r["name"]: i % 2 == 0 for i, r in enumerate(sorted(rows, key=lambda r: r["time_ratio"]))}
    classes = [("the budget's answer (fastest that fits)", "#009E73", [r for r in rows if r.get("chosen")])]
    classes += [(name, color, [r for r in rows if r.get("fits") is key and not r.get("chosen")])
                for key, (name, color) in FIT_KEY.items()]
    for name, color, part in classes:
        if not part:
            continue
        hover = [f"peak {r['peak_mb']:.4g} MB = {ci_text(r['peak_ratio'], r['peak_lo'], r['peak_hi'])} the baseline's"
                 f"<br>step {r['step_ms']:.3g} ms = {ci_text(r['time_ratio'], r['time_lo'], r['time_hi'])} the "
                 f"baseline's<br>{r['runs']} run(s)" + (f"<br>{r['accuracy']}" if r.get("accuracy") else "")
                 + (" · on the Pareto front" if r.get("front") else "")
                 for r in part]
        fig.add_scatter(
            x=[r["time_ratio"] for r in part], y=[r["peak_ratio"] for r in part], mode="markers+text", name=name,
            text=[_label(r) for r in part], cliponaxis=False,
            textposition=["top center" if above[r["name"]] else "bottom center" for r in part],
            error_x=_whiskers(part, "time_ratio", "time_lo", "time_hi"),
            error_y=_whiskers(part, "peak_ratio", "peak_lo", "peak_hi"),
            marker={"size": 11, "color": color,
                    "symbol": ["star" if r.get("chosen") else "circle" for r in part],
                    "line": {"color": "black", "width": [2 if r.get("front") else 0 for r in part]}},
            customdata=hover, hovertemplate="<b>%{text}</b><br>%{customdata}<extra></extra>")
    budget, ratio = trade.get("budget_mb"), trade.get("budget_ratio")
    if _finite(ratio):
        fig.add_hline(y=ratio, line_dash="dash", line_color="#E69F00",
                      annotation_text=f"budget {budget:g} MB", annotation_position="bottom right")
    base = trade.get("baseline_peak_mb")
    sub = f"baseline peak {base:.4g} MB by {trade.get('measure')}; " if _finite(base) else ""
    sub += ("each point one short try (no interval)" if trade.get("source") == "budget"
            else "whiskers: 95 % CI (3+ runs per arm)")
    top = max([r["peak_ratio"] for r in rows] + [r["peak_hi"] for r in rows if _finite(r.get("peak_hi"))]
              + ([ratio] if _finite(ratio) else []) + [1.0])
    fig.update_layout(title=fig_title(title, sub), height=440,
                      xaxis_title="step time (x the baseline's, lower is faster)",
                      yaxis={"title": {"text": "peak memory (x the baseline's)"}, "range": [0, 1.12 * top]},
                      legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0})
    return fig


__all__ = ["FIT_KEY", "memory_vs_time"]
