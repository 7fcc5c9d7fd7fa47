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


#: Link colours and dashes: distinct in hue *and* line style, so 100GbE, NVLink and ideal never blur.
LINK_STYLES = [("#0072B2", "solid"), ("#D55E00", "dash"), ("#009E73", "dashdot"), ("#CC79A7", "longdash"),
               ("#E69F00", "dot"), ("#56B4E9", "longdashdot")]


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def scaling_curves(rows_by_link: Mapping[str, Sequence[Mapping[str, float]]],
                   measured: tuple[int, float] | None = None, title: str = "Projected speedup",
                   rel_error: float | None = None) -> go.Figure:
    """Speedup vs workers per link (from :func:`lab.distributed.scaling.project`, or ``project_band``
    whose ``speedup_lo`` / ``speedup_hi`` become a shaded band), the ideal line, and the measured
    (p, speedup) point when there is one. ``rel_error`` (the model's worst held-out error) labels the
    figure validated or unvalidated (:func:`~lab.distributed.scaling.trust`)."""
    fig = go.Figure()
    ps = [r["p"] for r in next(iter(rows_by_link.values()))]
    fig.add_trace(go.Scatter(x=ps, y=ps, mode="lines", name="ideal (p x)", line={"dash": "dot", "color": "#333333",
                                                                                  "width": 1}))
    for i, (name, rows) in enumerate(rows_by_link.items()):
        color, dash = LINK_STYLES[i % len(LINK_STYLES)]
        x = [r["p"] for r in rows]
        if all("speedup_lo" in r for r in rows):
            fig.add_trace(go.Scatter(x=x + x[::-1], y=[r["speedup_hi"] for r in rows] + [r["speedup_lo"]
                                                                                       for r in rows][::-1],
                                     fill="toself", fillcolor=_rgba(color, 0.15), line={"width": 0},
                                     hoverinfo="skip", showlegend=False, legendgroup=name))
        fig.add_trace(go.Scatter(x=x, y=[r["speedup"] for r in rows], mode="lines+markers", name=name,
                                 legendgroup=name, line={"color": color, "dash": dash},
                                 customdata=[[r["efficiency"], r.get("speedup_lo", r["speedup"]),
                                              r.get("speedup_hi", r["speedup"])] for r in rows],
                                 hovertemplate=name + ": p=%{x}<br>speedup %{y:.3g} (band %{customdata[1]:.3g}-"
                                               "%{customdata[2]:.3g})<br>efficiency %{customdata[0]:.0%}"
                                               "<extra></extra>"))
    if measured:
        fig.add_trace(go.Scatter(x=[measured[0]], y=[measured[1]], mode="markers", name="measured here",
                                 marker={"size": 12, "symbol": "star", "color": "black"}))
    label = sm.trust(rel_error)
    sub = ("UNVALIDATED: " if label.startswith("unvalidated") else "") + label.split(": ", 1)[-1]
    fig.update_layout(title={"text": title, "subtitle": {"text": sub if rel_error is not None else label}},
                      xaxis_title="workers (p)", yaxis_title="speedup vs 1 worker (x)",
                      xaxis_type="log", yaxis_type="log", height=460)
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
