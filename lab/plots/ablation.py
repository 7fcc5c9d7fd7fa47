"""Figures of an ablation (``lab.ablation.summarize``'s table): speed bought against accuracy paid, with the
Pareto front and the noise band, and the speedups as bars with their intervals.

Readability rules (checked in a real browser by ``tests/e2e/test_browser.py``): a short title with the
explanation as a subtitle, the colour key in the legend, every point labelled with its arm (labels alternate
above and below, so neighbours do not print over each other; the A/A arm reads "A/A"), whiskers clipped to
:func:`lab.plots.common.ratio_range` with the clipping drawn, axes titled with their units. Every number
(point, whisker, hover) is the arm's record (:mod:`lab.ablation.record`), the one the table shows.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from lab.ablation.record import AblationRecord, build_record
from lab.ablation.summary import AA_ARM
from lab.plots.common import clipped_whiskers, fig_title, ratio_bars, ratio_range

#: The colour key of the scatter: whether the accuracy loss is within the seed noise.
NOISE_KEY = {True: ("within seed noise", "#009E73"), False: ("outside seed noise", "#D55E00"),
             None: ("noise unknown (one seed)", "#7f7f7f")}


def _speed_label(speed: str) -> str:
    return {"train_speedup": "training speedup, end-to-end (x vs baseline)",
            "step_speedup": "training step speedup (x vs baseline)",
            "infer_speedup": "inference speedup (x vs baseline)",
            "ttt_speedup": "time-to-target speedup (x vs baseline)"}.get(speed, speed)


def _noise_key(value: object) -> bool | None:
    return None if value is None or (isinstance(value, float) and pd.isna(value)) else bool(value)


def _short(arm: str) -> str:
    return "A/A" if arm == AA_ARM else arm


def speedup_vs_accuracy(df: pd.DataFrame, speed: str = "train_speedup", front: Sequence[str] | None = None,
                        budget_pt: float | None = None, record: AblationRecord | None = None) -> go.Figure:
    """Each arm at (speedup, accuracy loss) with 95 % CI whiskers on the speedup (clipped, shown); a grey
    noise band around (1x, 0 pt) (the baseline's seed spread); the Pareto front as a line; an optional
    accuracy budget as a dashed line. One trace per noise class, so the legend is the colour key.
    Input: ``summarize``'s table (and its record, built here when not given)."""
    record = record or build_record(df)
    has = pd.Series([record.arms[a].speed.get(speed) is not None for a in df["arm"]], index=df.index)
    ok = df[(df["status"] != "error") & has].copy()
    ok[speed] = [record.arms[a].speed[speed].value for a in ok["arm"]]
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
    clipped_any = False
    above = {a: i % 2 == 0 for i, a in enumerate(ok.sort_values(speed)["arm"])}
    for key, (name, color) in NOISE_KEY.items():
        part = ok[[_noise_key(v) is key for v in ok["within_noise"]]]
        if part.empty:
            continue
        plus, minus, clipped = clipped_whiskers(part[speed].tolist(), part[f"{speed}_lo"].tolist(),
                                                part[f"{speed}_hi"].tolist(), bounds)
        clipped_any |= any(clipped)
        ci = [record.arms[a].speed[speed].text + (" (clipped)" if c else "")
              for a, c in zip(part["arm"], clipped, strict=True)]
        fig.add_scatter(
            x=part[speed], y=part["acc_loss_pt"], mode="markers+text", name=name,
            text=[_short(a) for a in part["arm"]], cliponaxis=False,
            textposition=["top center" if above[a] else "bottom center" for a in part["arm"]],
            error_x={"type": "data", "symmetric": False, "array": plus, "arrayminus": minus},
            marker={"size": 11, "color": color,
                    "symbol": ["diamond" if c else "circle" for c in clipped]},
            customdata=list(zip(ci, part["why"].fillna("").astype(str).str.slice(0, 120), strict=True)),
            hovertemplate="<b>%{text}</b><br>%{customdata[0]}<br>accuracy loss %{y:.2g} pt"
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


def speedup_bars(df: pd.DataFrame, speeds: Sequence[str] = ("train_speedup", "infer_speedup"),
                 record: AblationRecord | None = None) -> go.Figure:
    """Grouped horizontal bars per arm: training and inference speedup with 95 % CI whiskers (clipped,
    shown), the record's figures; an axis the arm cannot change has no bar; 1x marked."""
    record = record or build_record(df)
    series = {_speed_label(speed).split(" (")[0].split(",")[0]:
              [(_short(a), r.value, r.lo, r.hi) for a, rec in record.arms.items()
               if rec.status != "error" and (r := rec.speed.get(speed)) is not None]
              for speed in speeds}
    return ratio_bars(series, title="Speedup vs baseline", subtitle="95 % bootstrap CI; no bar: does not apply",
                      yaxis_title="speedup (x vs baseline)")
