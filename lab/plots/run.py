"""Figures of single runs: where the step time went, the loss curve, and the per-technique detail figures
that apply to a run (what the dashboard shows under a run)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import plotly.graph_objects as go

from lab.ablation.record import ArmRecord
from lab.plots.common import PHASE_COLORS, fig_title
from lab.plots.details import FAMILY_FIGURES, record_figures
from lab.result import RunResult, section


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
    fig.update_layout(barmode="stack", title=fig_title("Where the step time goes", "median step, warm-up excluded"),
                      xaxis_title="ms per step (median)", legend_title="phase", height=180 + 36 * len(results))
    fig.update_yaxes(automargin=True)
    return fig


def loss_curves(results: Sequence[RunResult], labels: Sequence[str] | None = None) -> go.Figure:
    """Training loss per step, one line per run."""
    labels = list(labels) if labels is not None else [_label(r) for r in results]
    fig = go.Figure()
    for r, name in zip(results, labels, strict=True):
        fig.add_scatter(y=r.losses, mode="lines", name=name)
    fig.update_layout(title="Training loss", xaxis_title="step", yaxis_title="loss")
    return fig


def _loss_scale(result: RunResult) -> go.Figure | None:
    diag = (result.details.get("precision", {}).get("phases") or {}).get("train") or {}
    if not diag.get("loss_scale_history"):
        return None
    from lab.plots.precision import loss_scale_history

    return loss_scale_history(diag)


def _layer_sparsity(result: RunResult) -> go.Figure | None:
    if not section(result, "pruning").get("layers"):
        return None
    from lab.plots.pruning import layer_sparsity_bars

    return layer_sparsity_bars(result)


def _op_classes(result: RunResult) -> go.Figure | None:
    """``--profile`` (or the dashboard's profile toggle): where a profiled step goes by op class, the doctor's
    bar (:func:`lab.plots.doctor.op_class_bars`), training step and inference call one bar each."""
    prof = result.details.get("profile") or {}
    bars = {"training step (compiled)" if prof.get("compiled") else "training step": prof.get("train")}
    if prof.get("inference"):
        bars[f"inference (batch {prof['inference'].get('batch', '?')})"] = prof["inference"]
    bars = {k: v for k, v in bars.items() if isinstance(v, dict) and v.get("ms")}
    if not bars:
        return None
    from lab.plots.doctor import op_class_bars

    fig = op_class_bars(bars, title="Where a profiled step goes (op classes)")
    fig.update_layout(title=fig_title("Where a profiled step goes", "op classes from torch.profiler, steps after "
                                                                    "the timed ones (not in the timings)"))
    return fig


def _memory_budget(result: RunResult) -> go.Figure | None:
    """A run that ``--memory-budget`` chose: every configuration its search measured, memory against time."""
    found = result.details.get("memory_budget")
    if not found:
        return None
    from lab.ablation.memory_trade import from_budget
    from lab.plots.memory import memory_vs_time

    return memory_vs_time(from_budget(found), title=f"Memory budget {found['budget_mb']:g} MB: what was tried")


# name -> builder(RunResult) -> Figure | None (None: nothing to show for this run). A family with a detail
# figure adds one entry here; the dashboard shows whatever applies.
DETAIL_FIGURES: dict[str, Callable[[RunResult], go.Figure | None]] = {
    "loss scale (fp16)": _loss_scale, "per-layer sparsity": _layer_sparsity, **FAMILY_FIGURES,
    "op classes (profiled)": _op_classes, "memory budget search": _memory_budget,
}


def technique_figures(result: RunResult, arm: ArmRecord | None = None) -> dict[str, go.Figure]:
    """The per-technique detail figures that apply to ``result`` (a failing builder is skipped, not fatal:
    a detail view must never hide the ablation table). With the arm's record, the figures the table also
    shows (int8 latency, MACs vs measured) are drawn from the record instead of this one run."""
    out = {}
    from_record = record_figures(arm) if arm is not None else {}
    for name, build in DETAIL_FIGURES.items():
        if arm is not None and name in ("int8 latency", "MACs vs measured"):
            if name in from_record:
                out[name] = from_record[name]
            continue
        try:
            fig = build(result)
        except (KeyError, TypeError, ValueError):
            fig = None
        if fig is not None:
            out[name] = fig
    return out
