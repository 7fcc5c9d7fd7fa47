"""Figures of an ablation (``lab.ablation.summarize``'s table): speed bought against accuracy paid, with the
Pareto front and the noise band, and the speedups as bars with their intervals."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from lab.plots.common import ratio_bars


def _speed_label(speed: str) -> str:
    return {"train_speedup": "training speedup (end-to-end, x)", "step_speedup": "training step speedup (x)",
            "infer_speedup": "inference speedup (x)"}.get(speed, speed)


def speedup_vs_accuracy(df: pd.DataFrame, speed: str = "train_speedup", front: Sequence[str] | None = None,
                        budget_pt: float | None = None) -> go.Figure:
    """Each arm at (speedup, accuracy loss) with 95 % CI whiskers on the speedup; a grey noise band
    around (1x, 0 pt) (the baseline's own seed spread, at least the speedup CI of the baseline); the
    Pareto front as a line; an optional accuracy budget as a dashed line. Input: ``summarize``'s table."""
    ok = df[(df["status"] != "error") & df[speed].notna()]
    fig = go.Figure()
    noise = ok.loc[ok["arm"] == "baseline", "noise_pt"]
    noise_pt = float(noise.iloc[0]) if len(noise) and pd.notna(noise.iloc[0]) else 0.0
    fig.add_shape(type="rect", x0=0.95, x1=1.05, y0=-max(noise_pt, 0.05), y1=max(noise_pt, 0.05),
                  fillcolor="lightgrey", opacity=0.4, line_width=0, layer="below")
    fig.add_vline(x=1.0, line_dash="dot", line_color="grey")
    if front:
        pts = ok.set_index("arm").loc[[a for a in front if a in set(ok["arm"])]].sort_values(speed)
        fig.add_scatter(x=pts[speed], y=pts["acc_loss_pt"], mode="lines", name="Pareto front",
                        line={"color": "black", "dash": "dash"}, hoverinfo="skip")
    fig.add_scatter(
        x=ok[speed], y=ok["acc_loss_pt"], mode="markers+text", name="arms", text=ok["arm"],
        textposition="top center",
        error_x={"type": "data", "symmetric": False, "array": (ok[f"{speed}_hi"] - ok[speed]).tolist(),
                 "arrayminus": (ok[speed] - ok[f"{speed}_lo"]).tolist()},
        marker={"size": 11, "color": [{True: "#2ca02c", False: "#d62728"}.get(w, "#7f7f7f")
                                      for w in ok["within_noise"]]},
        customdata=ok[["why"]].fillna("").to_numpy(),
        hovertemplate="%{text}<br>%{x:.2f}x, %{y:.2f} pt<br>%{customdata[0]}<extra></extra>",
    )
    if budget_pt is not None:
        fig.add_hline(y=budget_pt, line_dash="dash", line_color="#ff7f0e",
                      annotation_text=f"budget {budget_pt:g} pt")
    fig.update_layout(title="Speed bought vs accuracy paid (green: within seed noise, red: outside, grey: one seed)",
                      xaxis_title=_speed_label(speed), yaxis_title="accuracy loss (points, lower is better)",
                      showlegend=bool(front))
    return fig


def speedup_bars(df: pd.DataFrame, speeds: Sequence[str] = ("train_speedup", "infer_speedup")) -> go.Figure:
    """Grouped bars per arm: training and inference speedup with 95 % CI error bars; 1x marked."""
    ok = df[df["status"] != "error"]
    series = {_speed_label(speed): list(zip(ok["arm"], ok[speed], ok[f"{speed}_lo"], ok[f"{speed}_hi"], strict=True))
              for speed in speeds}
    return ratio_bars(series, title="Speedup vs baseline (95 % bootstrap CI)", yaxis_title="speedup (x)")
