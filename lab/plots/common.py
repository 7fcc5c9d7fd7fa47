"""What every figure shares: the phase colours and one bar chart of ratios with 95 % CI whiskers.

Why one ratio chart: a speedup (or a size ratio) is read against 1x, with its interval; the ablation, the
precision and the quantization figures all draw that same thing from different records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

PHASE_COLORS = {"data_wait": "#d62728", "forward": "#1f77b4", "backward": "#2ca02c", "optimizer": "#9467bd",
                "comm": "#ff7f0e", "other": "#7f7f7f"}

#: (bar label, ratio, CI low, CI high)
RatioBar = tuple[str, float, float, float]


def ratio_bars(series: Mapping[str, Sequence[RatioBar]], *, title: str, yaxis_title: str,
               colors: Mapping[str, str] | None = None, bar_colors: Sequence[str] | None = None,
               height: int = 380) -> go.Figure:
    """Grouped bars, one group per ``series`` name, each bar a ratio with asymmetric 95 % CI whiskers; the
    dotted line at 1 is "no change". ``bar_colors`` colours the bars of a single series one by one."""
    fig = go.Figure()
    for name, bars in series.items():
        labels = [b[0] for b in bars]
        est = [b[1] for b in bars]
        marker = {"color": list(bar_colors)} if bar_colors is not None else (
            {"color": colors[name]} if colors and name in colors else {})
        fig.add_bar(name=name, x=labels, y=est, marker=marker,
                    error_y={"type": "data", "symmetric": False, "array": [b[3] - b[1] for b in bars],
                             "arrayminus": [b[1] - b[2] for b in bars]})
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(barmode="group", title=title, yaxis_title=yaxis_title, height=height,
                      showlegend=len(series) > 1)
    return fig
