"""Plotly figures for the mixed-precision lab (notebook 02 and the dashboard).

Pure functions: data in, Figure out, nothing shown or written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from lab.plots.common import ratio_bars
from lab.precision import TORCH_DTYPES

DTYPE_COLORS = {"fp32": "#1f77b4", "bf16": "#2ca02c", "fp16": "#d62728", "auto": "#9467bd"}


def dtype_ranges(dtypes: Sequence[str] = ("fp16", "bf16", "fp32")) -> go.Figure:
    """Each format's representable magnitudes on a log10 axis: subnormal floor, smallest normal, largest.
    Why it matters: fp16 loses gradients below ~6e-8 and overflows above 65504; bf16 has fp32's range
    but only 8 mantissa bits."""
    fig = go.Figure()
    for i, name in enumerate(dtypes):
        info = torch.finfo(TORCH_DTYPES[name])
        lo, tiny, hi = float(info.smallest_normal) * float(info.eps), float(info.tiny), float(info.max)
        fig.add_trace(go.Scatter(x=[lo, tiny, hi], y=[name] * 3, mode="lines+markers", name=name,
                                 line={"color": DTYPE_COLORS.get(name), "width": 8},
                                 hovertext=[f"smallest subnormal {lo:.3g}", f"smallest normal {tiny:.3g}",
                                            f"max {hi:.3g}"], hoverinfo="text+name"))
        fig.add_annotation(x=0, y=i, xref="paper", text=f"eps {float(info.eps):.2g}", showarrow=False,
                           xanchor="left", yshift=14)
    fig.update_xaxes(type="log", title="magnitude (log scale)")
    fig.update_layout(title="Representable range per format", height=300, showlegend=False)
    return fig


def loss_scale_history(diag: Mapping[str, Any], title: str = "GradScaler") -> go.Figure:
    """Loss scale per step (log axis) with skipped steps marked, and the unscaled gradient norm below."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("loss scale (x = skipped step)", "gradient L2 norm (unscaled)"))
    scales = list(diag.get("loss_scale_history", []))
    fig.add_trace(go.Scatter(y=scales, mode="lines", name="loss scale"), row=1, col=1)
    skipped = list(diag.get("skipped_steps", []))
    fig.add_trace(go.Scatter(x=skipped, y=[scales[s] for s in skipped if s < len(scales)], mode="markers",
                             marker={"symbol": "x", "size": 10, "color": "red"}, name="skipped"), row=1, col=1)
    fig.add_trace(go.Scatter(y=list(diag.get("grad_norms", [])), mode="lines", name="grad norm"), row=2, col=1)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_xaxes(title="step", row=2, col=1)
    fig.update_layout(title=title, height=420)
    return fig


def dtype_speedup_bars(speedups: Mapping[str, tuple[float, float, float]],
                       title: str = "Speedup vs fp32") -> go.Figure:
    """fp32 step time / variant step time with its bootstrap CI; the line at 1 is "no gain"."""
    bars = [(n, *speedups[n]) for n in speedups]
    return ratio_bars({"speedup": bars}, title=title, yaxis_title="x faster than fp32 (median step, 95 % CI)",
                      bar_colors=[DTYPE_COLORS.get(n.split("/")[-1], "#7f7f7f") for n in speedups], height=360)


def layer_dtype_table(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """The per-layer dtype report as a table; fp32 islands carry their reason."""
    cols = ["module", "type", "input_dtype", "output_dtype", "fp32_reason"]
    fig = go.Figure(go.Table(header={"values": cols},
                             cells={"values": [[str(r.get(c, ""))[:70] for r in rows] for c in cols]}))
    fig.update_layout(title="What autocast actually ran (first training step)", height=80 + 28 * len(rows))
    return fig
