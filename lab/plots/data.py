"""Plotly figures for the data-loading lab (notebook 01 and the dashboard).

Pure functions: data in, Figure out, nothing shown or written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from lab.data.studies.stalls import COMPUTE_PHASES
from lab.plots.common import PHASE_COLORS


def phase_bars(step_times_ms: Mapping[str, Mapping[str, Sequence[float]]], *, skip: int = 1) -> go.Figure:
    """Stacked bars of the median step's phases per loader: the red slice is time the model waited for data."""
    fig = go.Figure()
    names = list(step_times_ms)
    for phase in ("data_wait", *COMPUTE_PHASES):
        vals = [float(np.median(step_times_ms[n].get(phase, [0.0])[skip:] or [0.0])) for n in names]
        if any(vals):
            fig.add_trace(go.Bar(x=names, y=vals, name=phase, marker_color=PHASE_COLORS[phase]))
    fig.update_layout(barmode="stack", title="Median step, by phase", yaxis_title="ms", height=350)
    return fig


def wait_timeline(step_times_ms: Mapping[str, Mapping[str, Sequence[float]]]) -> go.Figure:
    """Data wait per step for each loader: a prefetcher's wait drops after its buffer fills."""
    fig = go.Figure()
    for name, times in step_times_ms.items():
        fig.add_trace(go.Scatter(y=list(times.get("data_wait", [])), mode="lines+markers", name=name))
    fig.update_layout(title="Data wait per step", xaxis_title="step", yaxis_title="ms", height=320)
    return fig


def skew_bars(reports: Sequence[Mapping]) -> go.Figure:
    """Label rate per part for each sharding strategy; the dashed line is the whole log's rate."""
    fig = go.Figure()
    for rep in reports:
        fig.add_trace(go.Bar(x=[f"part {i}" for i in range(rep["parts"])], y=rep["label_rate"],
                             name=f"{rep['strategy']} (max shift {rep['max_feature_shift_sd']:.2f} sd)"))
    if reports:
        rates, rows = np.asarray(reports[0]["label_rate"]), np.asarray(reports[0]["rows"])
        fig.add_hline(y=float((rates * rows).sum() / rows.sum()), line_dash="dash", annotation_text="whole log")
    fig.update_layout(barmode="group", title="Click rate each rank/worker sees, by sharding strategy",
                      yaxis_title="label rate", height=350)
    return fig


def tuner_heatmap(rows: Sequence[Mapping]) -> go.Figure:
    """Throughput per (workers, depth) candidate; blank cells were over the memory cap and not run."""
    workers = sorted({r["candidate"].num_workers for r in rows})
    depths = sorted({r["candidate"].depth for r in rows})
    z = [[None] * len(depths) for _ in workers]
    for r in rows:
        c = r["candidate"]
        z[workers.index(c.num_workers)][depths.index(c.depth)] = r["throughput"]
    fig = go.Figure(go.Heatmap(z=z, x=[str(d) for d in depths], y=[str(w) for w in workers],
                               colorbar={"title": "samples/s"}))
    fig.update_layout(title="Auto-tuner: throughput by workers × prefetch depth", xaxis_title="depth",
                      yaxis_title="workers (0 = thread prefetcher)", height=320)
    return fig


def loader_row(name: str, result: Any) -> dict[str, str]:
    """One loader's row of the Loading table, from the same measured steps as :func:`phase_bars`: the median step
    and its data wait (what the chart stacks) beside the wait's share of all measured time (which also counts the
    few long stalls). The table said "waits 20.6 %" beside a chart showing ~1 ms of a 19 ms step: both were right,
    one a mean share, the other a median, and neither said which."""
    total, wait = result.measured_ms(), result.measured_ms("data_wait")
    share = result.data_wait_fraction
    return {"Loader": name,
            "Median step (ms)": f"{np.median(total):.3g}" if total else "",
            "Data wait in the median step (ms)": f"{np.median(wait):.3g}" if wait else "",
            "Data wait, share of all measured time": "" if share is None else f"{100 * share:.1f} %",
            "Samples/s": f"{result.throughput_samples_per_s or 0.0:.3g}"}
