"""Figures of an ablation (``lab.ablation.summarize``'s table): speed bought against accuracy paid, with the
Pareto front and the noise band, and the speedups as bars with their intervals.

Readability rules (checked in a real browser by ``tests/test_browser.py``): a short title with the
explanation as a subtitle, the colour key in the legend, arm names as hover text once there are more than
:data:`LABEL_MAX` arms (printed labels overlap), whiskers clipped to :func:`lab.plots.common.ratio_range`
with the clipping drawn, axes titled with their units.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from lab.plots.common import clipped_whiskers, fig_title, ratio_bars, ratio_range

#: Up to this many arms the scatter prints their names; beyond, names are hover text only.
LABEL_MAX = 5
#: The colour key of the scatter: whether the accuracy loss is within the seed noise.
NOISE_KEY = {True: ("within seed noise", "#009E73"), False: ("outside seed noise", "#D55E00"),
             None: ("noise unknown (one seed)", "#7f7f7f")}


def _speed_label(speed: str) -> str:
    return {"train_speedup": "training speedup, end-to-end (x vs baseline)",
            "step_speedup": "training step speedup (x vs baseline)",
            "infer_speedup": "inference speedup (x vs baseline)"}.get(speed, speed)


def _noise_key(value: object) -> bool | None:
    return None if value is None or (isinstance(value, float) and pd.isna(value)) else bool(value)


def speedup_vs_accuracy(df: pd.DataFrame, speed: str = "train_speedup", front: Sequence[str] | None = None,
                        budget_pt: float | None = None) -> go.Figure:
    """Each arm at (speedup, accuracy loss) with 95 % CI whiskers on the speedup (clipped, shown); a grey
    noise band around (1x, 0 pt) (the baseline's seed spread); the Pareto front as a line; an optional
    accuracy budget as a dashed line. One trace per noise class, so the legend is the colour key.
    Input: ``summarize``'s table."""
    ok = df[(df["status"] != "error") & df[speed].notna()]
    fig = go.Figure()
    noise = ok.loc[ok["arm"] == "baseline", "noise_pt"]
    noise_pt = float(noise.iloc[0]) if len(noise) and pd.notna(noise.iloc[0]) else 0.0
    fig.add_shape(type="rect", x0=0.95, x1=1.05, y0=-max(noise_pt, 0.05), y1=max(noise_pt, 0.05),
                  fillcolor="lightgrey", opacity=0.4, line_width=0, layer="below")
    fig.add_vline(x=1.0, line_dash="dot", line_color="grey")
    bounds = ratio_range(ok[speed].tolist(), ok[f"{speed}_lo"].tolist(), ok[f"{speed}_hi"].tolist(), floor=None)
    if front:
        pts = ok.set_index("arm").loc[[a for a in front if a in set(ok["arm"])]].sort_values(speed)
        fig.add_scatter(x=pts[speed], y=pts["acc_loss_pt"], mode="lines", name="Pareto front",
                        line={"color": "black", "dash": "dash"}, hoverinfo="skip")
    printed = len(ok) <= LABEL_MAX
    clipped_any = False
    for key, (name, color) in NOISE_KEY.items():
        part = ok[[_noise_key(v) is key for v in ok["within_noise"]]]
        if part.empty:
            continue
        plus, minus, clipped = clipped_whiskers(part[speed].tolist(), part[f"{speed}_lo"].tolist(),
                                                part[f"{speed}_hi"].tolist(), bounds)
        clipped_any |= any(clipped)
        ci = [f"[{lo:.3g}, {hi:.3g}]" + (" (clipped)" if c else "") if pd.notna(lo) else "no interval"
              for lo, hi, c in zip(part[f"{speed}_lo"], part[f"{speed}_hi"], clipped, strict=True)]
        fig.add_scatter(
            x=part[speed], y=part["acc_loss_pt"], mode="markers+text" if printed else "markers", name=name,
            text=part["arm"], textposition="top center", cliponaxis=False,
            error_x={"type": "data", "symmetric": False, "array": plus, "arrayminus": minus},
            marker={"size": 11, "color": color,
                    "symbol": ["diamond" if c else "circle" for c in clipped]},
            customdata=list(zip(ci, part["why"].fillna("").astype(str).str.slice(0, 120), strict=True)),
            hovertemplate="<b>%{text}</b><br>%{x:.3g}x, 95 % CI %{customdata[0]}<br>accuracy loss %{y:.2g} pt"
                          "<br>%{customdata[1]}<extra></extra>")
    if clipped_any:
        fig.add_scatter(x=[None], y=[None], mode="markers", name="diamond: CI clipped (hover)",
                        marker={"symbol": "diamond", "size": 11, "color": "white", "line": {"color": "black",
                                                                                           "width": 1}})
    if budget_pt is not None:
        fig.add_hline(y=budget_pt, line_dash="dash", line_color="#E69F00",
                      annotation_text=f"budget {budget_pt:g} pt", annotation_position="top left")
    fig.update_xaxes(range=list(bounds), title_text=_speed_label(speed))
    fig.update_layout(title=fig_title("Speed vs accuracy", "95 % CI whiskers; grey band: seed noise"),
                      yaxis_title="accuracy loss (pt, lower is better)", height=420,
                      legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0})
    return fig


def speedup_bars(df: pd.DataFrame, speeds: Sequence[str] = ("train_speedup", "infer_speedup")) -> go.Figure:
    """Grouped horizontal bars per arm: training and inference speedup with 95 % CI whiskers (clipped,
    shown); an axis the arm cannot change has no bar; 1x marked."""
    ok = df[df["status"] != "error"]
    series = {_speed_label(speed).split(" (")[0].split(",")[0]:
              [(a, s, lo, hi) for a, s, lo, hi in zip(ok["arm"], ok[speed], ok[f"{speed}_lo"], ok[f"{speed}_hi"],
                                                      strict=True) if pd.notna(s)]
              for speed in speeds}
    return ratio_bars(series, title="Speedup vs baseline", subtitle="95 % bootstrap CI; no bar: does not apply",
                      yaxis_title="speedup (x vs baseline)")
