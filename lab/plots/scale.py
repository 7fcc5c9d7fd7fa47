"""Where does it pay? The crossover map as figures: speedup against model size, one line per technique.

Pure functions of the map's JSON (:mod:`lab.crossover`), shared by ``notebooks/07_scale.ipynb`` and the
dashboard page "Where does it pay?": log-x model size (parameters or MACs per sample), each technique's
speedup with its 95 % CI band, the measured crossover as a marker, a user's model as a vertical line, and the
raw figures (base / technique ms, regime, why) on hover.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative

_X = {"params": ("params", "parameters", "measured_params"),
      "macs": ("macs_per_sample", "MACs per sample", "measured_macs")}


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def crossover_figure(the_map: dict[str, Any], workload: str, axis: str = "train_step", *, x: str = "params",
                     techniques: list[str] | None = None, user_x: float | None = None,
                     user_label: str = "your model", height: int = 460) -> go.Figure:
    """Speedup vs model size for one workload and axis (``train_step`` or ``inference``)."""
    if x not in _X:
        raise ValueError(f"x={x!r} is invalid: allowed: {', '.join(_X)}")
    key, label, cross_key = _X[x]
    rows = [r for r in the_map["rows"] if r["workload"] == workload and r["axis"] == axis and r["speedup"] is not None]
    names = techniques or list(dict.fromkeys(r["technique"] for r in rows))
    fig = go.Figure()
    palette = qualitative.Plotly
    for i, tech in enumerate(names):
        pts = sorted((r for r in rows if r["technique"] == tech), key=lambda r: r[key])
        if not pts:
            continue
        color = palette[i % len(palette)]
        xs = [r[key] for r in pts]
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=[r["ci_hi"] for r in pts] + [r["ci_lo"] for r in pts][::-1],
                                 fill="toself", fillcolor=_rgba(color, 0.15), line={"width": 0}, hoverinfo="skip",
                                 showlegend=False, legendgroup=tech, name=f"{tech} 95 % CI"))
        hover = [f"{tech} at {r['rung']}: x{r['speedup']:.2f} [{r['ci_lo']:.2f}, {r['ci_hi']:.2f}]<br>"
                 f"{r['params']:,} params, {r['macs_per_sample'] / 1e6:.3g} MMACs/sample<br>"
                 f"base {r['base_ms']:.3g} ms, {tech} {r['tech_ms']:.3g} ms<br>{(r.get('why') or '')[:160]}"
                 for r in pts]
        fig.add_trace(go.Scatter(x=xs, y=[r["speedup"] for r in pts], mode="lines+markers", name=tech,
                                 line={"color": color}, legendgroup=tech, hovertext=hover, hoverinfo="text"))
        cross = next((c for c in the_map.get("crossovers", []) if c["workload"] == workload
                      and c["technique"] == tech and c["axis"] == axis and c.get(cross_key)), None)
        if cross is not None:
            at = next((r for r in pts if r[key] == cross[cross_key]), None)
            if at is not None:
                fig.add_trace(go.Scatter(x=[at[key]], y=[at["speedup"]], mode="markers", legendgroup=tech,
                                         marker={"symbol": "star", "size": 14, "color": color,
                                                 "line": {"width": 1, "color": "black"}},
                                         name=f"{tech} pays from here", showlegend=False,
                                         hovertext=f"{tech}: measured crossover at {at['rung']}", hoverinfo="text"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    if user_x:
        fig.add_vline(x=user_x, line_dash="dash", line_color="black", annotation_text=user_label,
                      annotation_position="top")
    fig.update_xaxes(type="log", title=f"model size ({label})")
    fig.update_yaxes(type="log", title=f"speedup vs fp32 eager ({axis.replace('_', ' ')})")
    fig.update_layout(title=f"{workload}: {axis.replace('_', ' ')} speedup against model size (star: pays from here)",
                      height=height, legend={"orientation": "h", "y": -0.2}, margin={"t": 60})
    return fig


def regime_figure(the_map: dict[str, Any], axis: str = "train_step", height: int = 360) -> go.Figure:
    """Each workload's baseline step time against model size, the marker shape its regime tag."""
    symbols = {"dispatch-bound": "circle", "compute-bound": "square", "memory-bound": "diamond"}
    fig = go.Figure()
    seen: set[tuple[str, str]] = set()
    pts = []
    for r in the_map["rows"]:
        if r["axis"] == axis and r["base_ms"] is not None and r["technique"] != "workers1" \
                and (r["workload"], r["rung"]) not in seen:
            seen.add((r["workload"], r["rung"]))
            pts.append(r)
    for wl in dict.fromkeys(r["workload"] for r in pts):
        mine = sorted((r for r in pts if r["workload"] == wl), key=lambda r: r["params"])
        fig.add_trace(go.Scatter(x=[r["params"] for r in mine], y=[r["base_ms"] for r in mine], mode="lines+markers",
                                 name=wl, marker={"symbol": [symbols.get(r["regime"], "x") for r in mine], "size": 10},
                                 hovertext=[f"{wl} {r['rung']}: {r['why'][:160]}" for r in mine], hoverinfo="text"))
    fig.update_xaxes(type="log", title="parameters")
    fig.update_yaxes(type="log", title=f"fp32 {axis.replace('_', ' ')} ms")
    fig.update_layout(title="Baseline time and regime (circle dispatch-, square compute-, diamond memory-bound)",
                      height=height, legend={"orientation": "h", "y": -0.25})
    return fig


def utilisation_figure(the_map: dict[str, Any], axis: str = "train_step", height: int = 360) -> go.Figure:
    """Each workload's fp32 baseline as a share of the map's machine card GEMM peak
    (:func:`lab.measure.map_utilisation`) against model size: how far from the limit the baseline already runs,
    which decides whether a technique that speeds up GEMMs can pay. Above 100 %: the model's kernels beat the
    card's own GEMM at its measured shape (the card is then not this model's ceiling; said on the figure)."""
    from lab.measure import map_utilisation

    pts = [r for r in map_utilisation(the_map) if r["axis"] == axis]
    fig = go.Figure()
    if not pts:
        fig.add_annotation(text="this map carries no machine card: no utilisation (rerun the map)", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_layout(title="Share of this machine's GEMM peak", height=200, xaxis_visible=False,
                          yaxis_visible=False)
        return fig
    for wl in dict.fromkeys(r["workload"] for r in pts):
        mine = sorted((r for r in pts if r["workload"] == wl), key=lambda r: r["params"])
        fig.add_trace(go.Scatter(
            x=[r["params"] for r in mine], y=[100 * r["share"] for r in mine], mode="lines+markers", name=wl,
            hovertext=[f"{wl} {r['rung']}: {100 * r['share']:.3g} % of the fp32 peak "
                       f"({r['achieved_gflops']:.3g} of {r['peaks']['fp32']['gflops']:.3g} GFLOP/s)" for r in mine],
            hoverinfo="text"))
    fig.add_hline(y=100.0, line_dash="dot", line_color="gray", annotation_text="card's fp32 GEMM peak",
                  annotation_position="bottom right")
    fig.update_xaxes(type="log", title="parameters")
    fig.update_yaxes(type="log", title=f"fp32 {axis.replace('_', ' ')}: % of the GEMM peak")
    fig.update_layout(title="How far from this machine's limit the baseline runs (fp32, share of the card's peak)",
                      height=height, legend={"orientation": "h", "y": -0.25})
    return fig


def reference_figure(reference: list[dict[str, Any]], height: int = 380) -> go.Figure:
    """The lab beside plain PyTorch (``map["reference"]``): per technique x axis two bars with their 95 % CI
    whiskers, and the target as a marker where there is one."""
    from lab.plots.common import fig_title

    rows = [r for r in reference if r.get("plain") is not None]
    labels = [f"{r['technique']}<br>{r['axis'].replace('_', ' ')}" for r in rows]
    fig = go.Figure()
    for key, name, color in (("lab", "lab", qualitative.Plotly[0]), ("plain", "plain PyTorch", qualitative.Plotly[1])):
        est = [r[key] for r in rows]
        fig.add_bar(x=labels, y=est, name=name, marker_color=color,
                    error_y={"type": "data", "symmetric": False,
                             "array": [(r[f"{key}_hi"] - r[key]) if r[key] is not None else 0 for r in rows],
                             "arrayminus": [(r[key] - r[f"{key}_lo"]) if r[key] is not None else 0 for r in rows]},
                    hovertemplate="%{x}: %{y:.2f}x<extra>" + name + "</extra>")
    targets = [(lbl, r["target"]) for lbl, r in zip(labels, rows, strict=True) if r.get("target")]
    if targets:
        fig.add_scatter(x=[t[0] for t in targets], y=[t[1] for t in targets], mode="markers", name="target",
                        marker={"symbol": "line-ew-open", "size": 28, "color": "black", "line": {"width": 2}},
                        hovertemplate="target %{y:.2f}x<extra></extra>")
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    rung = rows[0]["rung"] if rows else ""
    fig.update_layout(title=fig_title(f"Lab vs plain PyTorch, mlp {rung}",
                                      "same model and batch, arms interleaved; whiskers: 95 % CI"),
                      barmode="group", height=height, yaxis_title="speedup vs fp32 (x)",
                      legend={"orientation": "h", "y": -0.25}, margin={"t": 70})
    return fig


#: The map's axes as a person says them.
AXIS_WORDS = {"train_step": "training step", "inference": "inference"}


def _cell(x: Any, fmt: Callable[[float], str]) -> str:
    """A table cell: ``fmt`` of ``x`` as a number, blank where ``x`` is missing, not a number, or NaN."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return ""
    return "" if v != v else fmt(v)


def _g3(x: Any) -> str:
    return _cell(x, lambda v: f"{v:.3g}")


def _count(x: Any) -> str:
    """A parameter count as a person reads it: ``209,434`` (3 significant digits would print ``2.09e+05``)."""
    return _cell(x, lambda v: f"{round(v):,}")


def placement_table(predictions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A placed model's predictions (:func:`lab.crossover.place`) as a person reads them: the axis in words, the
    speedup at 3 digits, whether it pays, and the leave-one-out error (how far the ladder's own fit missed a rung it
    did not see) as a percentage, where the page showed ``predicted_speedup`` 2.9156 and ``loo_error`` 0.4692."""
    return [{"Technique": p["technique"], "Axis": AXIS_WORDS.get(p["axis"], p["axis"]),
             "Predicted speedup (x)": _g3(p.get("predicted_speedup")), "Pays": "yes" if p.get("pays") else "no",
             "Fit's error on a held-out rung": "" if p.get("loo_error") is None else f"{100 * p['loo_error']:.0f} %"}
            for p in predictions]


def crossover_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The map's crossovers (where each technique starts to pay) in words and 3 digits."""
    return [{"Technique": c["technique"], "Axis": AXIS_WORDS.get(c["axis"], c["axis"]),
             "Pays from (measured rung)": c.get("measured_rung") or "never on this ladder",
             "Measured at (params)": _count(c.get("measured_params")),
             "Predicted from (rung)": c.get("predicted_rung") or "",
             "Predicted at (params)": _count(c.get("predicted_params")),
             "Prediction within one rung": {True: "yes", False: "no"}.get(c.get("within_one_rung"), "")}
            for c in rows]
