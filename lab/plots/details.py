"""Each family's own figures and sentences for one run, from ``result.details`` (the dashboard's technique
details panel): precision (dtypes per layer, loss scale, auto's reason), quantization (swapped layers,
size, float-vs-int8 latency with CI), pruning (per-layer sparsity, MACs ratio vs measured), DDP (comm vs
compute, effective batch), data (wait per step against the ideal, wait-free bound).

Why from ``details``: that is what a stored run keeps, so a run browsed days later shows the same panel.
A builder returns None when its family did not touch the run. Inside an ablation the panel is given the arm's
record (:mod:`lab.ablation.record`): every figure the table also shows (size, MACs, inference speedups) is
then the record's, pooled over the arm's runs, not the first run's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import plotly.graph_objects as go

from lab.ablation.record import ArmRecord
from lab.measure import utilisation_line
from lab.plots.common import PHASE_COLORS, fig_title, ratio_bars
from lab.result import RunResult, section


def _train_diag(result: RunResult) -> dict[str, Any]:
    return (result.details.get("precision", {}).get("phases") or {}).get("train") or {}


def layer_dtypes(result: RunResult) -> go.Figure | None:
    rows = _train_diag(result).get("layer_dtypes") or []
    if not rows:
        return None
    from lab.plots.precision import layer_dtype_table

    fig = layer_dtype_table(rows)
    fig.update_layout(title=fig_title("Dtypes per layer", "what autocast ran in the first training step"),
                      height=min(120 + 28 * len(rows), 600), margin={"t": 70})
    return fig


def quant_swaps(result: RunResult) -> go.Figure | None:
    swap = result.details.get("quant", {}).get("swap") or {}
    asked = swap.get("asked") or {}
    if not asked:
        return None
    swapped, reasons = swap.get("swapped") or {}, swap.get("kept_float_reasons") or {}
    names = list(asked)
    became = [swapped.get(n, "kept float") for n in names]
    why = [reasons.get(n, "" if n in swapped else "not swapped by the backend") for n in names]
    fig = go.Figure(go.Table(header={"values": ["layer", "float type", "int8 as", "why kept float"]},
                             cells={"values": [names, [asked[n] for n in names], became, why]}))
    fig.update_layout(title=fig_title("Layers swapped to int8", f"{swap.get('n_swapped', '?')} of "
                                                                f"{swap.get('n_asked', len(names))} asked"),
                      height=min(130 + 28 * len(names), 600), margin={"t": 70})
    return fig


def quant_latency(result: RunResult) -> go.Figure | None:
    lat = result.details.get("quant", {}).get("latency") or {}
    bars = [(k.replace("batch_", "batch "), v["ratio"], v.get("ci_lo", math.nan), v.get("ci_hi", math.nan))
            for k, v in lat.items() if isinstance(v, dict) and "ratio" in v]
    if not bars:
        return None
    return ratio_bars({"int8 vs float": bars}, title="int8 vs float latency",
                      subtitle="float median / int8 median, 95 % CI; > 1: int8 faster",
                      yaxis_title="speedup of int8 (x)")


def macs_vs_measured(result: RunResult) -> go.Figure | None:
    p = section(result, "pruning")
    inf = p.get("inference") or {}
    if "macs_ratio" not in p or "speedup" not in inf:
        return None
    ci = inf.get("ci95") or [math.nan, math.nan]
    return ratio_bars({"ratio": [("MACs ratio (theory)", p["macs_ratio"], math.nan, math.nan),
                                 ("measured inference", inf["speedup"], ci[0], ci[1])]},
                      title="Fewer MACs vs measured speed", subtitle="dense / pruned; 95 % CI on the measured",
                      yaxis_title="ratio vs dense (x)", bar_colors=["#999999", "#0072B2"])


def ddp_split(result: RunResult) -> go.Figure | None:
    if section(result, "distributed").get("world_size", 1) <= 1:
        return None
    med = result.phase_medians_ms()
    compute = sum(med.get(k, 0.0) for k in ("data_wait", "forward", "backward", "optimizer"))
    fig = go.Figure([go.Bar(y=["median step"], x=[compute], orientation="h", name="compute (excl. comm)",
                            marker_color=PHASE_COLORS["forward"]),
                     go.Bar(y=["median step"], x=[med.get("comm", 0.0)], orientation="h",
                            name="all-reduce in flight", marker_color=PHASE_COLORS["comm"])])
    fig.update_layout(barmode="stack", title=fig_title("Comm vs compute (DDP)", "rank 0, median step"),
                      xaxis_title="ms per step", height=240)
    return fig


def data_wait(result: RunResult) -> go.Figure | None:
    t = result.step_times_ms
    if not t.get("data_wait") or not any(t["data_wait"]):
        return None
    total, wait = np.asarray(t.get("total", []), float), np.asarray(t["data_wait"], float)
    fig = go.Figure()
    fig.add_scatter(y=wait.tolist(), mode="lines", name="data wait", line={"color": PHASE_COLORS["data_wait"]})
    if len(total) == len(wait) and len(total):
        fig.add_scatter(y=total.tolist(), mode="lines", name="step", line={"color": "#555555"})
        ideal = float(np.median(total - wait))
        fig.add_hline(y=ideal, line_dash="dash", line_color="#009E73",
                      annotation_text=f"ideal (no wait): {ideal:.3g} ms", annotation_position="top left")
    fig.update_layout(title=fig_title("Data wait per step", "against the wait-free (ideal loader) bound"),
                      xaxis_title="step", yaxis_title="ms", height=320)
    return fig


#: name -> builder(RunResult) -> Figure | None, in the order the panel shows them.
FAMILY_FIGURES: dict[str, Callable[[RunResult], go.Figure | None]] = {
    "dtypes per layer": layer_dtypes, "int8 swaps": quant_swaps, "int8 latency": quant_latency,
    "MACs vs measured": macs_vs_measured, "comm vs compute": ddp_split, "data wait per step": data_wait,
}


def record_figures(arm: ArmRecord) -> dict[str, go.Figure]:
    """The arm's inference figures from its record, replacing the first run's "int8 latency" and "MACs vs
    measured": both inference measurements at the table's batch, and the MACs a zero-skipping kernel would save."""
    bars = []
    at = f" (batch {arm.batch})" if arm.batch else ""
    if arm.macs_if_skipped is not None:
        bars.append(("MACs if zeros skipped (theory)", arm.macs_if_skipped.value, math.nan, math.nan))
    if arm.paired is not None:
        bars.append((f"same process{at}", arm.paired.value, arm.paired.lo, arm.paired.hi))
    inf = arm.speed.get("infer_speedup")
    if inf is not None and bars:
        bars.append((f"vs baseline's runs{at}", inf.value, inf.lo, inf.hi))
    if not bars:
        return {}
    name = "int8 latency" if "int8" in arm.paired_what else "MACs vs measured"
    fig = ratio_bars({"ratio": bars}, title="Inference: theory and the two measurements",
                     subtitle=f"{arm.paired_what or 'vs the baseline'}; 95 % CI; > 1: faster",
                     yaxis_title="x vs reference", bar_colors=["#999999", "#0072B2", "#56B4E9"][-len(bars):])
    return {name: fig}


def _pct(x: float) -> str:
    return f"{100 * x:.2g} %"


def technique_notes(result: RunResult, arm: ArmRecord | None = None) -> list[str]:
    """One sentence per family fact a figure cannot say: the dtype asked and run (and auto's reason), the
    int8 size, the MACs and sparsity, the effective DDP batch, the data-wait share. With the arm's record,
    its figures (size, MACs, inference) and its "why" are the record's, word for word."""
    d, notes = result.details, []
    prec = d.get("precision") or {}
    if prec.get("requested") and prec.get("requested") != "fp32":
        notes.append(f"Precision: asked {prec['requested']}, trained in {prec.get('resolved', '?')}"
                     + (f" ({(prec.get('capability') or {}).get('reason')})" if prec.get("capability") else ""))
        if (prec.get("auto") or {}).get("why"):
            notes.append(f"auto: {prec['auto']['why']}")
        diag = _train_diag(result)
        if diag.get("grad_scaler"):
            notes.append(f"Loss scaling: {len(diag.get('skipped_steps') or [])} step(s) skipped for inf/nan gradients")
    q = d.get("quant") or {}
    if arm is not None and q.get("method"):
        notes.append(f"int8 ({q.get('method')}, {str(q.get('api', '?')).split(' ')[0]}): output error "
                     f"{_pct(q.get('output_rel_error', math.nan))} (this run)")
    elif q.get("float_bytes"):
        api = str(q.get("api", "?")).split(" ")[0]
        notes.append(f"int8 ({q.get('method')}, {api}): model {q['float_bytes'] / 1e3:.3g} kB "
                     f"-> {q['int8_bytes'] / 1e3:.3g} kB ({q.get('size_ratio', math.nan):.2g}x smaller); output "
                     f"error {_pct(q.get('output_rel_error', math.nan))}")
    p = section(d, "pruning")
    if arm is not None and p.get("method"):
        notes.append(f"Pruning ({p.get('method')} {_pct(p.get('amount', 0))}, {p.get('schedule')})")
    elif p.get("macs_ratio"):
        inf = p.get("inference") or {}
        ci = inf.get("ci95") or [math.nan, math.nan]
        notes.append(f"Pruning ({p.get('method')} {_pct(p.get('amount', 0))}, {p.get('schedule')}): "
                     f"{p['macs_ratio']:.2g}x fewer MACs if zeros were skipped; measured inference "
                     f"{inf.get('speedup', math.nan):.2g}x [{ci[0]:.2g}, {ci[1]:.2g}] at batch {inf.get('batch', '?')}")
    ddp = section(d, "distributed")
    if ddp.get("world_size", 1) > 1:
        batch = (d.get("resolved") or {}).get("batch_size", result.batch_size)
        eff = batch * ddp["world_size"] * ddp.get("grad_accum_steps", 1) if batch else None
        notes.append(f"DDP: {ddp['world_size']} ranks ({ddp.get('backend')}, {ddp.get('launcher')}); effective batch "
                     f"{eff if eff else '?'} = {batch} per rank x {ddp['world_size']} ranks x "
                     f"{ddp.get('grad_accum_steps', 1)} accumulation step(s)")
    prof = d.get("profile") or {}
    if prof.get("train") or prof.get("note"):
        steps = (prof.get("steps") or {}).get("active", "?")
        notes.append(f"Profiled: {steps} {'compiled ' if prof.get('compiled') else ''}training step(s) after the "
                     "timed ones (not in any timing)"
                     + (f"; Chrome trace `{prof['trace']}` (open it in ui.perfetto.dev)" if prof.get("trace") else "")
                     + (f"; {prof['note']}" if prof.get("note") else ""))
    if result.data_wait_fraction:
        notes.append(f"Data: the loop waited for data {_pct(result.data_wait_fraction)} of its step time")
    used = utilisation_line(d)
    if used:
        notes.append(used.strip()[:1].upper() + used.strip()[1:])
    if arm is not None:
        return notes + [n[:1].upper() + n[1:] for n in arm.figure_lines()] + [f"Why: {w}" for w in arm.why]
    for why in result.why:
        notes.append(f"Why: {why}")
    return notes
