"""Plotly figures for the pruning lab, shared by ``notebooks/03_pruning.ipynb`` and the dashboard.

Every function takes plain records (RunResults or the rows :mod:`lab.pruning` produces) and returns a
Figure, with no side effect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from lab.result import RunResult, section


def metric_vs_sparsity(rows: Sequence[Mapping[str, Any]], metric_name: str = "accuracy",
                       baseline: float | None = None) -> go.Figure:
    """One line per ``rows[i]["series"]`` of ``metric`` against ``sparsity`` (0-1), with the dense
    baseline as a dashed line: where the pruned curve leaves the baseline is the budget's edge."""
    fig = go.Figure()
    for name in dict.fromkeys(r["series"] for r in rows):
        pts = sorted((r["sparsity"], r["metric"]) for r in rows if r["series"] == name)
        fig.add_scatter(x=[100 * s for s, _ in pts], y=[m for _, m in pts], mode="lines+markers", name=name)
    if baseline is not None:
        fig.add_hline(y=baseline, line_dash="dash", annotation_text="dense baseline")
    fig.update_layout(title=f"{metric_name} vs sparsity", xaxis_title="sparsity (% of weights / channels)",
                      yaxis_title=metric_name)
    return fig


def layer_sparsity_bars(result: RunResult) -> go.Figure:
    """Per-layer sparsity of a pruned run (``details["pruning"]["layers"]``); hover shows shape and non-zeros.
    Global pruning spreads zeros unevenly, which is the point of looking."""
    layers = section(result, "pruning")["layers"]
    names = list(layers)
    fig = go.Figure(go.Bar(x=names, y=[100 * layers[n]["sparsity"] for n in names],
                           customdata=[[str(layers[n]["shape"]), layers[n]["nonzero"]] for n in names],
                           hovertemplate="%{x}<br>sparsity %{y:.1f} %<br>shape %{customdata[0]}"
                                         "<br>non-zeros %{customdata[1]}<extra></extra>"))
    p = section(result, "pruning")
    fig.update_layout(title=f"Per-layer sparsity: {p['method']} {p['amount']:.0%} ({p['schedule']})",
                      yaxis_title="sparsity %", yaxis_range=[0, 100])
    return fig


def macs_vs_measured(results: Sequence[RunResult], labels: Sequence[str]) -> go.Figure:
    """Grouped bars per pruned run: theoretical MACs ratio next to measured inference speedup (with its
    bootstrap 95 % CI). The gap between the two bars is what the "why" tags explain."""
    theory = [section(r, "pruning")["macs_ratio"] for r in results]
    inf = [section(r, "pruning").get("inference", {}) for r in results]
    measured = [i.get("speedup", float("nan")) for i in inf]
    err_hi = [i["ci95"][1] - i["speedup"] if i else 0 for i in inf]
    err_lo = [i["speedup"] - i["ci95"][0] if i else 0 for i in inf]
    fig = go.Figure()
    fig.add_bar(name="MACs ratio (theory)", x=list(labels), y=theory)
    fig.add_bar(name="measured inference speedup", x=list(labels), y=measured,
                error_y={"type": "data", "array": err_hi, "arrayminus": err_lo},
                hovertext=["; ".join(r.why) for r in results])
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(barmode="group", title="Theory vs measured (ratio vs dense, higher is faster)",
                      yaxis_title="x vs dense")
    return fig


def sensitivity_lines(rows: Sequence[Mapping[str, Any]], metric_name: str = "accuracy") -> go.Figure:
    """:func:`lab.pruning.sensitivity_scan` rows: one line per layer, metric against that layer's amount."""
    fig = go.Figure()
    for layer in dict.fromkeys(r["layer"] for r in rows):
        pts = [(r["amount"], r["metric"]) for r in rows if r["layer"] == layer]
        fig.add_scatter(x=[100 * a for a, _ in pts], y=[m for _, m in pts], mode="lines+markers", name=layer)
    fig.update_layout(title="Sensitivity: one layer pruned at a time, no fine-tuning",
                      xaxis_title="sparsity of that layer %", yaxis_title=metric_name)
    return fig


def schedule_curve(history: Sequence[Sequence[float]], total_steps: int, final: float) -> go.Figure:
    """The gradual schedule's sparsity updates (step, sparsity) against the one-shot step at the end."""
    fig = go.Figure()
    fig.add_scatter(x=[h[0] for h in history], y=[100 * h[1] for h in history], mode="lines+markers",
                    line_shape="hv", name="gradual (cubic)")
    fig.add_scatter(x=[0, total_steps, total_steps], y=[0, 0, 100 * final], mode="lines", line_shape="hv",
                    name="one-shot after training")
    fig.update_layout(title="Sparsity during training", xaxis_title="step", yaxis_title="sparsity %")
    return fig
