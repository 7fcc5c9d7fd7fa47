"""Plotly figures for the quantization lab (``notebooks/04_quantization``, the dashboard).

Each function takes plain rows (dicts from :func:`lab.quant.summary_row` / ``calibration_ablation``) and
returns a Figure with no side effects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import torch

from lab.plots.common import ratio_bars


def roundtrip_error(x: torch.Tensor, back: torch.Tensor, scale: float) -> go.Figure:
    """Quantize-dequantize error against the value, with the ``±scale/2`` bound every point must respect."""
    order = torch.argsort(x)
    xs, err = x[order].tolist(), (back - x)[order].tolist()
    fig = go.Figure()
    fig.add_scatter(x=xs, y=err, mode="markers", marker={"size": 3}, name="dequant(quant(x)) - x")
    for bound in (scale / 2, -scale / 2):
        fig.add_hline(y=bound, line_dash="dash", line_color="red")
    fig.update_layout(title=f"Round-trip error of 8-bit affine quantization (scale {scale:.4g}; bound ±scale/2)",
                      xaxis_title="x", yaxis_title="error", height=320)
    return fig


def latency_speedup_bars(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> go.Figure:
    """int8-vs-fp32 speedup per arm and batch size, with bootstrap 95 % CIs; the line at 1 is break-even."""
    series = {key.replace("_", " "): [(r["arm"], r[f"speedup_{key}"], *r[f"speedup_{key}_ci"]) for r in rows
                                      if f"speedup_{key}" in r] for key in keys}
    return ratio_bars(series, title="int8 speedup over fp32 (ratio of medians, 95 % CI)",
                      yaxis_title="× faster than fp32")


def size_accuracy(rows: Sequence[dict[str, Any]]) -> go.Figure:
    """Model size ratio vs accuracy loss per arm: the trade-off in one picture (hover for details)."""
    fig = go.Figure()
    fig.add_scatter(x=[r["size_ratio"] for r in rows], y=[r["loss_pts"] for r in rows], mode="markers+text",
                    text=[r["arm"] for r in rows], textposition="top center",
                    error_y={"type": "data", "symmetric": False,
                             "array": [r["loss_ci"][1] - r["loss_pts"] for r in rows],
                             "arrayminus": [r["loss_pts"] - r["loss_ci"][0] for r in rows]})
    fig.add_hline(y=0.0, line_dash="dot")
    fig.update_layout(title="Smaller vs worse: size ratio and accuracy loss (pts, paired bootstrap 95 % CI)",
                      xaxis_title="fp32 bytes / int8 bytes (whole checkpoint)", yaxis_title="loss (pts)",
                      height=380)
    return fig


def calibration_curve(rows: Sequence[dict[str, Any]]) -> go.Figure:
    """Accuracy loss of static int8 vs number of calibration batches, one line per observer."""
    fig = go.Figure()
    for obs in dict.fromkeys(r["observer"] for r in rows):
        mine = [r for r in rows if r["observer"] == obs]
        fig.add_scatter(x=[r["calibration_batches"] for r in mine], y=[r["loss_pts"] for r in mine],
                        mode="lines+markers", name=obs)
    fig.add_hline(y=0.0, line_dash="dot")
    fig.update_layout(title="Calibration: accuracy loss vs batches seen", xaxis_type="log",
                      xaxis_title="calibration batches", yaxis_title="loss vs fp32 (pts)", height=340)
    return fig
