"""What every figure shares: the phase colours, the clipping of long whiskers, and one bar chart of ratios
with 95 % CI whiskers.

Why one ratio chart: a speedup (or a size ratio) is read against 1x, with its interval; the ablation, the
precision and the quantization figures all draw that same thing from different records. Why clip: one
run on a busy machine can stretch an interval to 0.09-8.7x and squash every other bar to a sliver; the
axis keeps to the estimates' range and a clipped whisker is drawn to the edge with a marker and its true
end in the hover text, so the clipping is shown, never hidden.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from lab.ablation.record import fmt_ratio

PHASE_COLORS = {"data_wait": "#d62728", "forward": "#1f77b4", "backward": "#2ca02c", "optimizer": "#9467bd",
                "comm": "#ff7f0e", "other": "#7f7f7f"}
#: Series colours of ratio bars, distinct in hue (the Okabe-Ito palette, readable with colour blindness).
SERIES_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
#: A whisker may reach this factor beyond the largest estimate (and below the smallest) before it is clipped.
CLIP_FACTOR = 1.6

#: (bar label, ratio, CI low, CI high)
RatioBar = tuple[str, float, float, float]


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def ratio_range(estimates: Sequence[float], lows: Sequence[float] = (), highs: Sequence[float] = (),
                *, floor: float | None = 0.0) -> tuple[float, float]:
    """The axis range of ratios: it holds 1, every estimate and each whisker up to :data:`CLIP_FACTOR`
    beyond the estimates (``floor`` keeps bars from zero)."""
    est = [e for e in estimates if _finite(e)] or [1.0]
    top = max(max(est), 1.0) * CLIP_FACTOR
    bottom = min(min(est), 1.0) / CLIP_FACTOR
    hi = min(max([e for e in highs if _finite(e)] + est + [1.0]), top)
    lo = max(min([e for e in lows if _finite(e)] + est + [1.0]), bottom)
    pad = 0.05 * (hi - lo or 1.0)
    return (floor if floor is not None else lo - pad), hi + pad


def clipped_whiskers(est: Sequence[float], lo: Sequence[float], hi: Sequence[float],
                     bounds: tuple[float, float]) -> tuple[list[float], list[float], list[bool]]:
    """(plus, minus, clipped) of asymmetric whiskers cut at ``bounds``; NaN CIs give zero-length whiskers."""
    plus, minus, clipped = [], [], []
    for e, a, b in zip(est, lo, hi, strict=True):
        if not (_finite(e) and _finite(a) and _finite(b)):
            plus.append(0.0)
            minus.append(0.0)
            clipped.append(False)
            continue
        top, bottom = min(b, bounds[1]), max(a, bounds[0])
        plus.append(max(top - e, 0.0))
        minus.append(max(e - bottom, 0.0))
        clipped.append(b > bounds[1] or a < bounds[0])
    return plus, minus, clipped


def ci_text(est: float, lo: float, hi: float, unit: str = "x") -> str:
    """``1.2x [1.1, 1.4]``, or ``1.24x (no interval)`` when the CI is missing. A ratio (``unit="x"``) is said as
    the ablation record says it (:func:`lab.ablation.record.fmt_ratio`: rounded to its interval's precision), so
    a hover and the table never print the same figure two ways."""
    if not _finite(est):
        return ""
    if _finite(lo) and _finite(hi):
        if unit == "x":
            return fmt_ratio(est, lo, hi)
        return f"{est:.3g}{unit} [{lo:.3g}, {hi:.3g}]"
    return f"{est:.3g}{unit} (no interval)"


def ratio_bars(series: Mapping[str, Sequence[RatioBar]], *, title: str, yaxis_title: str,
               colors: Mapping[str, str] | None = None, bar_colors: Sequence[str] | None = None,
               height: int | None = None, subtitle: str | None = None) -> go.Figure:
    """Grouped horizontal bars (labels on the y axis, so long arm names never squash the plot), one group
    per ``series`` name in the legend, each bar a ratio with asymmetric 95 % CI whiskers clipped to
    :func:`ratio_range` (a clipped whisker ends in a marker; hover gives the full interval); the dotted line
    at 1 is "no change". ``bar_colors`` colours the bars of a single series one by one. ``yaxis_title``
    names the ratio axis (the horizontal one)."""
    fig = go.Figure()
    all_bars = [b for bars in series.values() for b in bars]
    bounds = ratio_range([b[1] for b in all_bars], [b[2] for b in all_bars], [b[3] for b in all_bars])
    labels = list(dict.fromkeys(b[0] for b in all_bars))
    clip_x, clip_y, clip_text = [], [], []
    for i, (name, bars) in enumerate(series.items()):
        est = [b[1] for b in bars]
        plus, minus, clipped = clipped_whiskers(est, [b[2] for b in bars], [b[3] for b in bars], bounds)
        color = (list(bar_colors) if bar_colors is not None else
                 (colors or {}).get(name, SERIES_COLORS[i % len(SERIES_COLORS)]))
        fig.add_bar(name=name, y=[b[0] for b in bars], x=est, orientation="h", marker={"color": color},
                    error_x={"type": "data", "symmetric": False, "array": plus, "arrayminus": minus},
                    customdata=[[ci_text(b[1], b[2], b[3], "x")] for b in bars],
                    hovertemplate="%{y}: %{customdata[0]}<extra>" + name + "</extra>")
        for b, c in zip(bars, clipped, strict=True):
            if c:
                clip_x.append(min(b[3], bounds[1]))
                clip_y.append(b[0])
                clip_text.append(f"{b[0]} ({name}): CI [{b[2]:.3g}, {b[3]:.3g}] clipped at the axis edge")
    if clip_x:
        fig.add_scatter(x=clip_x, y=clip_y, mode="markers", name="CI clipped (hover: full interval)",
                        marker={"symbol": "triangle-right", "size": 10, "color": "black"},
                        hovertext=clip_text, hoverinfo="text")
    fig.add_vline(x=1.0, line_dash="dot", line_color="grey")
    fig.update_xaxes(range=list(bounds), title_text=yaxis_title)
    fig.update_yaxes(categoryorder="array", categoryarray=labels[::-1], automargin=True)
    fig.update_layout(barmode="group", title=fig_title(title, subtitle),
                      height=height or max(260, 120 + 28 * len(labels) * max(1, len(series))),
                      showlegend=len(series) > 1 or bool(clip_x))
    return fig


def fig_title(text: str, subtitle: str | None = None) -> dict:
    """A short title (never cut in a half-width column) with the explanation as a subtitle."""
    out: dict = {"text": text}
    if subtitle:
        out["subtitle"] = {"text": subtitle}
    return out

