"""Pure functions from results to plotly figures, shared by notebooks and the dashboard.

Plotly is imported here and only here, so ``import lab`` stays free of plotting packages (the GPU box
that runs the benchmarks has none). Each function takes RunResults (or ``lab.ablation.summarize``'s
table) and returns a Figure; nothing is shown or written as a side effect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd
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


# ---------------------------------------------------------------------------------------------- ablations

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
    fig = go.Figure()
    for speed in speeds:
        fig.add_bar(name=_speed_label(speed), x=ok["arm"], y=ok[speed],
                    error_y={"type": "data", "symmetric": False, "array": (ok[f"{speed}_hi"] - ok[speed]).tolist(),
                             "arrayminus": (ok[speed] - ok[f"{speed}_lo"]).tolist()})
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(barmode="group", title="Speedup vs baseline (95 % bootstrap CI)", yaxis_title="x")
    return fig


# ---------------------------------------------------------------------------------------------- per-technique

def _loss_scale(result: RunResult) -> go.Figure | None:
    diag = (result.details.get("precision", {}).get("phases") or {}).get("train") or {}
    if not diag.get("loss_scale_history"):
        return None
    from lab.plots_precision import loss_scale_history

    return loss_scale_history(diag)


def _layer_sparsity(result: RunResult) -> go.Figure | None:
    if not result.details.get("prune", {}).get("layers"):
        return None
    from lab.plots_pruning import layer_sparsity_bars

    return layer_sparsity_bars(result)


def _data_wait(result: RunResult) -> go.Figure | None:
    if not result.step_times_ms.get("data_wait"):
        return None
    from lab.plots_data import wait_timeline

    return wait_timeline({"data wait": result.step_times_ms})


# name -> builder(RunResult) -> Figure | None (None: nothing to show for this run). A family that lands later
# (the scaling model, a loader's prefetch buffer) adds one entry here; the dashboard shows whatever applies.
DETAIL_FIGURES: dict[str, Callable[[RunResult], go.Figure | None]] = {
    "loss scale (fp16)": _loss_scale, "per-layer sparsity": _layer_sparsity, "data wait per step": _data_wait,
}


def technique_figures(result: RunResult) -> dict[str, go.Figure]:
    """The per-technique detail figures that apply to ``result`` (a failing builder is skipped, not fatal:
    a detail view must never hide the ablation table)."""
    out = {}
    for name, build in DETAIL_FIGURES.items():
        try:
            fig = build(result)
        except (KeyError, TypeError, ValueError):
            fig = None
        if fig is not None:
            out[name] = fig
    return out
