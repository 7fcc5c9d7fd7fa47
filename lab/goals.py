"""The report's goals from the machine that measured them, not constants: each speed goal is a share of its
ceiling on that machine's card (:mod:`lab.measure.ceiling`), a few absolute goals stay because they are the
mission's, and the constants that had no physical basis are retired with the reason.

Why: a goal such as "bf16 >= 1.8x" was set on one CPU before the machine card existed. On an AMX Xeon bf16
GEMMs run 7x fp32, on Zen 5 4.4x, on an AVX2 CPU 0.02x: the same constant hides headroom on the first and asks
the impossible of the last. Read at report time from each benchmark's own JSON (its environment stamp carries
the card it was measured with), so a committed result is re-judged without rerunning it; a result without a
card says "no card" instead of a guessed ceiling. :func:`derive` keeps the goal a figure was written with
(``goal_before`` / ``met_before``) beside the new one, so the two tables stay comparable.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from lab.measure import CEILING_KEYS, gemm_ratio, share_of_ceiling, speedup_vs_ceiling
from lab.registry import OLD_MAP_NAMES, OPTIONS

#: A GEMM-bound technique at the dense ladder's top rung keeps at least this share of the card's GEMM ratio
#: (the rest: casts, quantize / dequantize, the fp32 optimizer and the ops it does not speed).
GEMM_SHARE_GOAL = 0.5
#: What each kind of goal means in the report's notes.
KINDS = {"ceiling": "a share of its ceiling on this machine's card or run",
         "absolute": "an absolute goal kept: the mission's, or the lab's own quality (not a speed of the hardware)",
         "retired": "a fixed speedup retired (it held on one CPU, not on this one's card): reported beside its "
                    "ceiling, no verdict"}

#: (benchmark, figure-name pattern, why the constant is retired). The figure keeps its value, its ceiling and
#: share where one exists, and its old goal in ``goal_before``.
RETIRED: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("quantization", re.compile(r"^(ctr|sequence|vision|transformer|mlp) \w+( pt2e)? speedup vs fp32"),
     "a fixed int8 speed multiple on tiny / small models at batch 64, whose GEMMs are too small to amortise int8 "
     "(ctr: a 0.27 ms fp32 call, dispatch-bound); int8's speed goal is a share of the card's int8/fp32 GEMM "
     "ratio at the dense ladder's top rung (crossover), and the <= 0.5 pt accuracy goal stays here"),
    ("quantization", re.compile(r"quantized-layers size ratio$"),
     "the int8 format's size bound is below 4x by its per-channel scales and zero points (fp64 / int64 in the "
     "torch.ao flows), an amount that grows as layers narrow and that the JSON does not keep per layer; the size "
     "goal is held where the bound allows it, at the top rung (crossover: int8 layers size ratio >= 3.9x)"),
    ("pruning", re.compile(r"gradual - one-shot at 80 %"),
     "no physical basis at this size: a one-shot prune fine-tuned on a tiny model recovers as well as a gradual "
     "schedule (-0.1 / -0.03 / -0.28 pt on three machines); reported, no verdict"),
)
#: Crossover figures held against the card: (pattern on today's technique name and axis, dtype of the ratio).
_CROSSOVER_GEMM = {("bf16", "train_step"): "bf16", ("int8_eager", "inference"): "int8"}
_CROSSOVER_NAME = re.compile(r"^(?P<wl>\w+) (?P<rung>\w+) \((?P<params>[0-9.]+) M params\) (?P<tech>\S+) "
                             r"(?P<axis>train step|inference)$")
_MACS_SHARE = re.compile(r">= ([0-9.]+)x \(([0-9.]+) x its MACs ratio\)")
_FEWER_MACS = re.compile(r"([0-9.]+)x fewer MACs")
_LOSS = re.compile(r"loss (-?[0-9.]+) pts")
_INT8_SHARE = re.compile(r"int8 MAC share ([0-9.]+)%")


def int8_mac_share(note: str | None) -> float | None:
    """The share of MACs an int8 model runs in int8, from a note that states it ("int8 MAC share 83%")."""
    m = _INT8_SHARE.search(note or "")
    return float(m.group(1)) / 100 if m else None


def _current(name: str) -> str:
    return "+".join(OLD_MAP_NAMES.get(p, p) for p in (OLD_MAP_NAMES.get(name, name)).split("+"))


def map_row_ceiling(row: Mapping[str, Any], card: Mapping[str, Any] | None, threads: int | None = 1) -> dict[str, Any]:
    """The :data:`~lab.measure.ceiling.CEILING_KEYS` of one crossover-map row: its technique's options'
    overrides (a ``+`` stack: each part), the MACs ratio from its note, its regime for the why."""
    name = _current(str(row.get("technique")))
    try:
        overrides = [dict(OPTIONS.get(p).overrides) for p in name.split("+")]
    except (KeyError, ValueError):  # no longer an option: nothing to bound it by
        return {"ceiling": None, "ceiling_basis": f"unknown technique {name!r}", "share_of_ceiling": None,
                "share_why": ""}
    match = _FEWER_MACS.search(row.get("why") or "")
    return speedup_vs_ceiling(row.get("speedup"), overrides, str(row.get("axis")), card=card, threads=threads,
                              macs_ratio=float(match.group(1)) if match else None,
                              int8_mac_share=int8_mac_share(row.get("why")), regime=row.get("regime"))


def _card(envelope: Mapping[str, Any]) -> dict[str, Any] | None:
    return (envelope.get("env") or {}).get("machine_card") or envelope.get("machine_card") or None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _top_row(envelope: Mapping[str, Any], figure: Mapping[str, Any]) -> dict[str, Any] | None:
    """The crossover-map row a top-rung figure was read from (its name says workload, rung, technique, axis)."""
    m = _CROSSOVER_NAME.match(figure.get("name") or "")
    if not m or not isinstance(envelope.get("rows"), list):
        return None
    tech, axis = _current(m["tech"]), m["axis"].replace(" ", "_")
    return next((r for r in envelope["rows"] if r.get("workload") == m["wl"] and r.get("rung") == m["rung"]
                 and _current(str(r.get("technique"))) == tech and r.get("axis") == axis
                 and r.get("speedup") is not None), None)


def derive(envelope: Mapping[str, Any], figure: Mapping[str, Any]) -> dict[str, Any]:
    """The report's goal for one ``figure`` of a benchmark ``envelope``: ``goal``, ``met``, ``goal_kind``
    (:data:`KINDS`), ``goal_before`` / ``met_before`` (as written), ``retired_why``, and the figure's ceiling keys
    where it has one. A figure without a goal before gets none now (only its ceiling, where it has one)."""
    bench, name, value = envelope.get("benchmark"), str(figure.get("name") or ""), figure.get("value")
    before, met_before = figure.get("goal"), figure.get("met")
    out: dict[str, Any] = {"goal": before, "met": met_before, "goal_before": before, "met_before": met_before,
                           "goal_kind": "absolute" if before else None, "retired_why": None,
                           **{k: None for k in CEILING_KEYS}}
    card = _card(envelope)
    row = _top_row(envelope, figure) if bench == "crossover" else None
    if row is not None:
        out.update(map_row_ceiling(row, card, envelope.get("threads") or 1))
        tech, axis = _current(str(row["technique"])), row["axis"]
        dtype = _CROSSOVER_GEMM.get((tech, axis))
        if dtype and before and row["workload"] == "mlp":
            out.update(gemm_goal(value, card, dtype, envelope.get("threads") or 1))
        macs = _MACS_SHARE.search(before or "")
        if macs:  # already a share of its ceiling: restated as one
            need, share = float(macs.group(1)), float(macs.group(2))
            out.update(goal=f">= {need:.2f}x ({100 * share:.0f} % of its MACs ratio {need / share:.2f}x)",
                       goal_kind="ceiling")
    if bench == "pruning" and before:
        macs = _FEWER_MACS.search(figure.get("note") or "")
        if macs and "MACs ratio" in before:
            ratio = float(macs.group(1))
            share, why = share_of_ceiling(value if _finite(value) else None, ratio)
            out.update(ceiling=ratio, ceiling_basis=f"MACs ratio dense / pruned {ratio:.2f}x", share_of_ceiling=share,
                       share_why=why or ("layer too small" if "too small" in (figure.get("note") or "") else ""),
                       goal=f">= {0.7 * ratio:.2f}x (70 % of its MACs ratio {ratio:.2f}x)", goal_kind="ceiling")
        elif "0.8-1.25" in before:
            share, _ = share_of_ceiling(value if _finite(value) else None, 1.0)
            out.update(ceiling=1.0, ceiling_basis="unstructured masks: dense kernels skip no zeros (1x)",
                       share_of_ceiling=share, goal="80-125 % of its ceiling 1x (dense kernels skip no zeros)",
                       goal_kind="ceiling")
    if bench in ("data_loading", "data_threads") and before and "/ in-memory" in name:
        out.update(share_of_ceiling=value if _finite(value) else None, ceiling_basis="ideal loader: the in-memory "
                   "rate, compute alone", goal=">= 0.95 (95 % of the ideal-loader bound: the in-memory rate)"
                   + (" (best file loader)" if "best file loader" in before else ""), goal_kind="ceiling")
    if bench == "quantization" and "speedup vs fp32" in name and card:
        out.update(speedup_vs_ceiling(value if _finite(value) else None, [{"quant.method": "static"}], "inference",
                                      card=card, threads=1, int8_mac_share=int8_mac_share(figure.get("note"))))
    for where, pattern, why in RETIRED:
        if bench == where and before and pattern.search(name):
            loss = _LOSS.search(figure.get("note") or "") if "pt loss" in before else None
            if loss:  # the accuracy half of a retired speed goal stays
                out.update(goal="loss <= 0.5 pt (speed: share of its ceiling, no goal at this size)",
                           met=float(loss.group(1)) <= 0.5, goal_kind="absolute", retired_why=why)
            else:
                out.update(goal=None, met=None, goal_kind="retired", retired_why=why)
    return out


def gemm_goal(value: Any, card: Mapping[str, Any] | None, dtype: str, threads: int) -> dict[str, Any]:
    """``>= GEMM_SHARE_GOAL`` of the card's ``dtype``/fp32 GEMM ratio; "no card" (met unknown) without one,
    none where the ratio says the technique cannot pay here."""
    ratio = gemm_ratio(card, dtype, threads)
    what = f"the card's {dtype}/fp32 GEMM ratio"
    if ratio is None:
        return {"goal": f">= {100 * GEMM_SHARE_GOAL:.0f} % of {what}: no card", "met": None, "goal_kind": "ceiling"}
    if ratio <= 1.0:
        return {"goal": f"none: {what} is {ratio:.2g}x (cannot pay here)", "met": None, "goal_kind": "ceiling"}
    need = GEMM_SHARE_GOAL * ratio
    return {"goal": f">= {need:.2f}x ({100 * GEMM_SHARE_GOAL:.0f} % of {what} {ratio:.2f}x)",
            "met": bool(_finite(value) and value >= need), "goal_kind": "ceiling"}


def tally(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """``{"before": (met, with a verdict), "after": (met, with a verdict)}`` over full-setting rows: what moved."""
    full = [r for r in rows if not r.get("quick")]
    out = {}
    for when, goal, met in (("before", "goal_before", "met_before"), ("after", "goal", "met")):
        judged = [r for r in full if r.get(goal) and r.get(met) is not None]
        out[when] = (sum(1 for r in judged if r[met]), len(judged))
    return out


__all__ = ["GEMM_SHARE_GOAL", "KINDS", "RETIRED", "derive", "gemm_goal", "int8_mac_share", "map_row_ceiling", "tally"]
