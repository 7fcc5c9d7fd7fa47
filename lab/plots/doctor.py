"""Figures of the doctor (:mod:`lab.doctor`): where a step's time goes by op class, the prescription with
its intervals, and predicted vs measured after verification; and its two tables as a person reads them (named
columns with units and direction, every ratio rounded to its interval's precision as the ablation's table rounds
them, :func:`lab.ablation.record.fmt_ratio`). Shared by ``notebooks/08_doctor`` and the dashboard's Doctor page."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from lab.ablation.record import fmt_ratio, fmt_sig
from lab.doctor import Prediction
from lab.doctor.calibration import NOMINAL
from lab.measure.profile import OP_CLASSES
from lab.plots.common import ratio_bars
from lab.plots.tables import AXIS_NAMES

CLASS_COLORS = {"matmul": "#1f77b4", "embedding": "#17becf", "recurrent": "#8c564b", "norm": "#bcbd22",
                "elementwise": "#2ca02c", "reduction": "#e377c2", "optimizer": "#9467bd", "data_wait": "#d62728",
                "comm": "#ff7f0e", "overhead": "#7f7f7f", "other": "#c7c7c7"}


def op_class_bars(breakdowns: Mapping[str, Mapping[str, Any]], *, title: str = "Where the step goes") -> go.Figure:
    """One stacked horizontal bar per breakdown (``Breakdown.to_dict()``), ms per op class."""
    fig = go.Figure()
    labels = list(breakdowns)
    for cls in OP_CLASSES:
        xs = [float(b["ms"].get(cls, 0.0)) for b in breakdowns.values()]
        if any(x > 0 for x in xs):
            fig.add_bar(name=cls, y=labels, x=xs, orientation="h", marker_color=CLASS_COLORS[cls],
                        hovertemplate="%{x:.3f} ms<extra>" + cls + "</extra>")
    fig.update_layout(barmode="stack", title=title, xaxis_title="ms per step", height=160 + 60 * len(labels),
                      legend={"orientation": "h", "y": -0.35})
    return fig


def prescription_bars(predictions: Sequence[Prediction], *, title: str = "Predicted speedup") -> go.Figure:
    """Predicted speedups with their intervals, grouped by axis, best first."""
    series: dict[str, list[tuple[str, float, float, float]]] = {}
    for p in predictions:
        series.setdefault(p.axis, []).append((p.technique, p.speedup, p.lo, p.hi))
    return ratio_bars(series, title=title, yaxis_title="predicted speedup (x)")


def predicted_vs_measured(rows: Sequence[Mapping[str, Any]], *, title: str = "Predicted vs measured") -> go.Figure:
    """Each verified technique: predicted (x, with its interval) against measured (y, with its CI); on the
    diagonal the doctor was right."""
    fig = go.Figure()
    pts = [r for r in rows if r.get("measured") is not None]
    for axis in sorted({r["axis"] for r in pts}):
        on = [r for r in pts if r["axis"] == axis]
        fig.add_scatter(
            name=axis, mode="markers+text", text=[r["technique"] for r in on], textposition="top center",
            x=[r["predicted"] for r in on], y=[r["measured"] for r in on],
            error_x={"type": "data", "symmetric": False, "array": [r["predicted_hi"] - r["predicted"] for r in on],
                     "arrayminus": [r["predicted"] - r["predicted_lo"] for r in on]},
            error_y={"type": "data", "symmetric": False,
                     "array": [(r["measured_hi"] or r["measured"]) - r["measured"] for r in on],
                     "arrayminus": [r["measured"] - (r["measured_lo"] or r["measured"]) for r in on]})
    vals = [v for r in pts for v in (r["predicted"], r["measured"])] or [1.0]
    lo, hi = min(min(vals), 1.0) * 0.9, max(max(vals), 1.0) * 1.1
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dot", "color": "grey"}, name="exact",
                    hoverinfo="skip")
    fig.update_layout(title=title, xaxis_title="predicted speedup (x)", yaxis_title="measured speedup (x)",
                      height=420)
    return fig


#: The predicted interval's name in the tables' headers (the doctor's calibrated coverage).
PREDICTED = f"{NOMINAL:.0%} interval".replace("%", " %")


def _ratio(value: Any, lo: Any = None, hi: Any = None) -> str:
    nan = float("nan")
    return fmt_ratio(nan if value is None else float(value), nan if lo is None else float(lo),
                     nan if hi is None else float(hi))


def _drop_empty(out: pd.DataFrame) -> pd.DataFrame:
    return out.loc[:, [c for c in out.columns if (out[c] != "").any()]] if len(out) else out


def diagnosis_table(predictions: Sequence[Prediction]) -> pd.DataFrame:
    """The ranked prescription, one row per prediction: what it speeds up, the predicted speedup per step and over
    the run (with its one-off costs: compile, ``auto``'s probe) with their intervals, whether it is prescribed, and
    why. Ratios read ``1.4x [1.1, 1.8]`` (:func:`~lab.ablation.record.fmt_ratio`), never ``1.4123``."""
    out = pd.DataFrame([{
        "Rank": str(i + 1),
        "Technique": p.technique,
        "Speeds up": AXIS_NAMES.get(p.axis, p.axis),
        f"Predicted speedup per step (x, {PREDICTED}; above 1 is faster)": _ratio(p.speedup, p.lo, p.hi),
        f"Over this run, one-off costs included (x, {PREDICTED})": _ratio(p.run_speedup, p.run_lo, p.run_hi),
        "One-off cost (s)": fmt_sig(p.one_off_s, 2) if p.one_off_s else "",
        "Prescribed": "" if p.prescribed is None else "yes" if p.prescribed else "no: within noise or slower",
        "Why": p.reason,
    } for i, p in enumerate(predictions)])
    return _drop_empty(out)


def _measured(r: Mapping[str, Any]) -> str:
    if r.get("arm_error"):
        return f"{r.get('status')}: {str(r['arm_error'])[:120]}"
    if r.get("measured") is None:
        return "not measured"
    if r.get("measured_point"):
        return f"{fmt_sig(r['measured'])}x (a point: too few repeats for an interval)"
    if r.get("measured_lo") is None:  # too few repeats: no interval to round to
        return f"{fmt_sig(r['measured'])}x (too few repeats for an interval)"
    return _ratio(r["measured"], r.get("measured_lo"), r.get("measured_hi"))


def _yes(x: Any) -> str:
    return "" if x is None else "yes" if x else "no"


def verification_table(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Predicted vs measured (:func:`lab.doctor.verification.compare`'s rows), humanised: the predicted and the
    measured speedup with their intervals, the error in percent (``+12 %``: the doctor promised 12 % more than it
    got), whether the measurement fell inside the predicted interval, and the step time predicted and measured."""
    out = pd.DataFrame([{
        "Technique": r["technique"],
        "Speeds up": AXIS_NAMES.get(r["axis"], r["axis"]),
        f"Predicted (x, {PREDICTED})": _ratio(r["predicted"], r.get("predicted_lo"), r.get("predicted_hi")),
        "Measured (x, 95 % CI)": _measured(r),
        "Error (predicted / measured - 1; 0 is exact)": "" if r.get("error") is None else f"{100 * r['error']:+.0f} %",
        "Measured inside the predicted interval": _yes(r.get("inside") if r.get("measured") is not None else None),
        "Step time (ms): predicted -> measured": (f"{fmt_sig(r['predicted_step_ms'])} -> "
                                                  f"{fmt_sig(r['measured_step_ms'])}"
                                                  if r.get("predicted_step_ms") and r.get("measured_step_ms") else ""),
        "Prescribed": _yes(r.get("prescribed")),
    } for r in rows])
    return _drop_empty(out)


__all__ = ["CLASS_COLORS", "PREDICTED", "diagnosis_table", "op_class_bars", "predicted_vs_measured",
           "prescription_bars", "verification_table"]
