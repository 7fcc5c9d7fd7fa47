"""Threads on the crossover map as figures: pure functions of a threads study's JSON
(:mod:`lab.crossover.threads_study`), shown in the dashboard page "Where does it pay?" (section "Threads").

Three views: how much all cores buy the fp32 step per rung (near 1x where the step is dispatch-bound), each
technique's speedup at 1 thread against all cores (a verdict that flips is where the thread count changes
the advice), and loader worker against compute threads along the ladder with CI whiskers and the rung from
which the worker stops paying.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative


def thread_scaling_figure(study: dict[str, Any], axis: str = "train_step", height: int = 380) -> go.Figure:
    """Base ms at 1 thread / at N threads against parameters, one line per workload, the ideal (N) dotted."""
    comp = study["comparison"]
    n = comp["threads"][1]
    pts = [s for s in comp["scaling"] if s["axis"] == axis and s["scaling"] is not None]
    fig = go.Figure()
    for wl in dict.fromkeys(s["workload"] for s in pts):
        mine = sorted((s for s in pts if s["workload"] == wl), key=lambda s: s["params"])
        fig.add_trace(go.Scatter(x=[s["params"] for s in mine], y=[s["scaling"] for s in mine], mode="lines+markers",
                                 name=wl, hoverinfo="text",
                                 hovertext=[f"{wl} {s['rung']}: fp32 {s['base_ms_1']:.3g} ms at 1 thread, "
                                            f"{s['base_ms_n']:.3g} ms at {n}<br>{s['why'][:160]}" for s in mine]))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray", annotation_text="no gain")
    fig.add_hline(y=float(n), line_dash="dot", line_color="green", annotation_text=f"ideal x{n}")
    fig.update_xaxes(type="log", title="parameters")
    fig.update_yaxes(title=f"fp32 {axis.replace('_', ' ')}: 1 thread / {n} threads")
    fig.update_layout(title=f"What {n} threads buy the fp32 {axis.replace('_', ' ')}, per rung", height=height,
                      legend={"orientation": "h", "y": -0.25})
    return fig


def _whiskers(vals: list[float], cis: list[list[float] | None]) -> dict[str, Any]:
    hi = [(c[1] - v) if c and c[1] is not None else 0.0 for v, c in zip(vals, cis, strict=True)]
    lo = [(v - c[0]) if c and c[0] is not None else 0.0 for v, c in zip(vals, cis, strict=True)]
    return {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo}


def technique_threads_figure(study: dict[str, Any], workload: str, axis: str = "train_step",
                             height: int = 420) -> go.Figure:
    """Each technique's speedup against model size at 1 thread (solid) and at N threads (dashed), CI
    whiskers; a ringed marker where the verdict flips."""
    comp = study["comparison"]
    n = comp["threads"][1]
    rows = [r for r in comp["rows"] if r["workload"] == workload and r["axis"] == axis
            and r["speedup_1"] is not None and r["speedup_n"] is not None]
    fig = go.Figure()
    palette = qualitative.Plotly
    for i, tech in enumerate(dict.fromkeys(r["technique"] for r in rows)):
        pts = sorted((r for r in rows if r["technique"] == tech), key=lambda r: r["params"])
        color, xs = palette[i % len(palette)], [r["params"] for r in pts]
        for key, ci, dash, label in (("speedup_1", "ci_1", "solid", "1 thread"),
                                     ("speedup_n", "ci_n", "dash", f"{n} threads")):
            ys = [r[key] for r in pts]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{tech}, {label}", legendgroup=tech,
                                     line={"color": color, "dash": dash},
                                     error_y=_whiskers(ys, [r[ci] for r in pts]), hoverinfo="text",
                                     hovertext=[f"{tech} {r['rung']} at {label}: x{r[key]:.2f}<br>{r['why'][:160]}"
                                                for r in pts]))
        flips = [r for r in pts if r["flipped"]]
        if flips:
            fig.add_trace(go.Scatter(x=[r["params"] for r in flips], y=[r["speedup_n"] for r in flips], mode="markers",
                                     legendgroup=tech, showlegend=False, name=f"{tech} flips",
                                     marker={"size": 16, "color": "rgba(0,0,0,0)",
                                             "line": {"width": 2, "color": color}},
                                     hoverinfo="text", hovertext=[f"{tech} {r['rung']}: {r['verdict_1']} at 1 thread, "
                                                                  f"{r['verdict_n']} at {n}" for r in flips]))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_xaxes(type="log", title="parameters")
    fig.update_yaxes(type="log", title=f"speedup vs fp32 ({axis.replace('_', ' ')})")
    fig.update_layout(title=f"{workload}: speedup at 1 thread (solid) and {n} threads (dashed); ring: verdict flips",
                      height=height, legend={"orientation": "h", "y": -0.25})
    return fig


def workers_ladder_figure(study: dict[str, Any], height: int = 400) -> go.Figure:
    """The worker pair's throughput over the all-cores pair along the ladder, CI whiskers, and a dashed line
    at the rung from which a loader worker stops paying."""
    lad = study["ladder"]
    rows = [r for r in lad["rows"] if r["ratio"] is not None]
    n = lad["cores"]
    ys = [r["ratio"] for r in rows]
    colors = {"pays": "green", "loses": "firebrick"}
    fig = go.Figure(go.Scatter(
        x=[r["params"] for r in rows], y=ys, mode="lines+markers", name="worker / all cores",
        error_y=_whiskers(ys, [r.get("ci95") for r in rows]),
        marker={"size": 10, "color": [colors.get(r["verdict"], "gray") for r in rows]}, hoverinfo="text",
        hovertext=[f"{r['rung']}: x{r['ratio']:.2f} ({r['verdict']})<br>"
                   f"loader {r['loader_ms_per_batch']:.3g} ms/batch, "
                   f"compute {r['compute_ms_per_step']:.3g} ms/step<br>rule: {r['rule']['threads']} thread(s) + "
                   f"{r['rule']['workers']} worker(s)" for r in rows]))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    stop = lad["answer"].get("stops_paying_from")
    if stop and stop.get("params"):
        fig.add_vline(x=stop["params"], line_dash="dash", line_color="black",
                      annotation_text=f"stops paying from {stop['rung']}", annotation_position="top")
    fig.update_xaxes(type="log", title="parameters")
    fig.update_yaxes(title=f"throughput: {n - 1} thread(s) + 1 worker / {n} threads + prefetcher")
    fig.update_layout(title=f"{lad['workload']} from files: does a core given to a loader worker pay?",
                      height=height, showlegend=False)
    return fig
