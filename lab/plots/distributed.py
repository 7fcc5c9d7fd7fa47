"""Figures for the distributed lab (notebook 05 and the dashboard): pure functions from numbers to plotly.

Why a module: the notebook and the dashboard draw the same curves from the same measurements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from lab.distributed import scaling as sm


def allreduce_curve(sizes_bytes: Sequence[float], measured_s: Sequence[float], link: sm.Link, p: int = 2) -> go.Figure:
    """Measured all-reduce times against the fitted alpha-beta line (log-log: latency left, bandwidth right)."""
    lo, hi = min(sizes_bytes), max(sizes_bytes)
    xs = [lo * (hi / lo) ** (i / 49) for i in range(50)]
    fig = go.Figure([
        go.Scatter(x=list(sizes_bytes), y=[t * 1e3 for t in measured_s], mode="markers", name="measured"),
        go.Scatter(x=xs, y=[sm.ring_allreduce_s(x, p, link.alpha_s, link.beta_s_per_byte) * 1e3 for x in xs],
                   mode="lines", name=f"model: alpha={link.alpha_s * 1e6:.0f} us, "
                                      f"{link.bandwidth_bytes_per_s / 1e9:.2f} GB/s"),
    ])
    fig.update_layout(title=f"All-reduce time, {p} ranks", xaxis_title="message (bytes)", yaxis_title="ms",
                      xaxis_type="log", yaxis_type="log")
    return fig


def scaling_curves(rows_by_link: Mapping[str, Sequence[Mapping[str, float]]],
                   measured: tuple[int, float] | None = None, title: str = "Projected speedup") -> go.Figure:
    """Speedup vs workers per link (from :func:`lab.scaling_model.project`), the ideal line, and the
    measured (p, speedup) point when there is one."""
    fig = go.Figure()
    ps = [r["p"] for r in next(iter(rows_by_link.values()))]
    fig.add_trace(go.Scatter(x=ps, y=ps, mode="lines", name="ideal", line={"dash": "dot", "color": "grey"}))
    for name, rows in rows_by_link.items():
        fig.add_trace(go.Scatter(x=[r["p"] for r in rows], y=[r["speedup"] for r in rows], mode="lines+markers",
                                 name=name, customdata=[r["efficiency"] for r in rows],
                                 hovertemplate="p=%{x}<br>speedup %{y:.1f}<br>efficiency %{customdata:.0%}"))
    if measured:
        fig.add_trace(go.Scatter(x=[measured[0]], y=[measured[1]], mode="markers", name="measured here",
                                 marker={"size": 12, "symbol": "star"}))
    fig.update_layout(title=title, xaxis_title="workers (p)", yaxis_title="speedup vs 1 worker",
                      xaxis_type="log", yaxis_type="log")
    return fig


def step_breakdown(arms: Mapping[str, Mapping[str, float]]) -> go.Figure:
    """Per-step ms split into compute and all-reduce in flight, one bar per arm (``{"compute_ms", "comm_ms"}``)."""
    names = list(arms)
    fig = go.Figure([
        go.Bar(x=names, y=[arms[n]["compute_ms"] for n in names], name="compute (fwd+bwd+opt, excl. comm)"),
        go.Bar(x=names, y=[arms[n]["comm_ms"] for n in names], name="all-reduce in flight"),
    ])
    fig.update_layout(barmode="stack", title="Where a data-parallel step goes", yaxis_title="ms per step")
    return fig
