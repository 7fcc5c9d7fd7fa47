"""Pure functions from results to plotly figures, shared by notebooks and the dashboard.

Plotly is imported here and only here, so ``import lab`` stays free of plotting packages (the GPU box
that runs the benchmarks has none). Each function takes RunResults (or a DataFrame) and returns a Figure;
nothing is shown or written as a side effect.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from lab.result import RunResult

PHASE_COLORS = {"data_wait": "#d62728", "forward": "#1f77b4", "backward": "#2ca02c", "optimizer": "#9467bd",
                "comm": "#ff7f0e", "other": "#7f7f7f"}


def _label(result: RunResult) -> str:
    cfg = result.config
    return f"{result.workload}/{cfg.get('size')} seed {cfg.get('seed')} ({result.run_id[:6]})"


def phase_breakdown(results: Sequence[RunResult], labels: Sequence[str] | None = None) -> go.Figure:
    """Stacked horizontal bars of median step time by phase (warm-up excluded); time no phase claimed
    shows as ``other`` so the bars add up to the real median step."""
    labels = list(labels) if labels is not None else [_label(r) for r in results]
    fig = go.Figure()
    phases = ["data_wait", "forward", "backward", "optimizer", "comm"]
    medians = [r.phase_medians_ms() for r in results]
    for phase in phases:
        values = [m.get(phase, 0.0) for m in medians]
        if any(values):
            fig.add_bar(name=phase, y=labels, x=values, orientation="h", marker_color=PHASE_COLORS[phase])
    other = [max(0.0, m.get("total", 0.0) - sum(m.get(p, 0.0) for p in phases)) for m in medians]
    if any(v > 1e-3 for v in other):
        fig.add_bar(name="other", y=labels, x=other, orientation="h", marker_color=PHASE_COLORS["other"])
    fig.update_layout(barmode="stack", title="Median step time by phase", xaxis_title="ms per step",
                      legend_title="phase", height=160 + 40 * len(results))
    return fig


def loss_curves(results: Sequence[RunResult], labels: Sequence[str] | None = None) -> go.Figure:
    """Training loss per step, one line per run."""
    labels = list(labels) if labels is not None else [_label(r) for r in results]
    fig = go.Figure()
    for r, name in zip(results, labels, strict=True):
        fig.add_scatter(y=r.losses, mode="lines", name=name)
    fig.update_layout(title="Training loss", xaxis_title="step", yaxis_title="loss")
    return fig
