"""Every speedup beside its ceiling: what this machine and this run allow a technique, and how much of it came.

Why: "bf16 is 2.1x faster" cannot say whether 2.1x is all this CPU gives or a third of it. The machine card
(``python -m lab machine``, :mod:`lab.measure.machine`) measured the GEMM peak per dtype; the run measured its
step's phases (data wait, forward, backward, optimizer, comm) and its MACs. Together they bound each technique:

- a lower precision (bf16 / fp16): the card's GEMM peak in that dtype over fp32's, on the forward and backward
  phases; ``auto``: the best of fp32 / bf16 / fp16 there;
- int8 (inference): the card's int8 GEMM peak over fp32's, by Amdahl over the MACs where the share of them that
  runs in int8 is known (layers a flow leaves float stay at fp32 speed);
- channel pruning: the MACs ratio dense / pruned (fewer multiply-accumulates is all it removes); unstructured
  masks: 1x, dense kernels skip no zeros;
- data loading: the ideal-loader bound, the step with its data wait removed;
- a technique that removes one phase (a fused optimizer): Amdahl over the step's measured phases.

With the step's phases the kernel ratios enter through Amdahl too (a bf16 GEMM ratio of 4.4x cannot speed a step
whose optimizer and data wait take half of it by 4.4x); without them (the crossover map times a step whole) the
kernel ratio alone is the ceiling and the basis says so. Techniques the card says nothing about (compile, a
workload's fast kernels, memory levers, distributed) get no ceiling, with the reason. A technique is described
by its options' config overrides (``{"precision.dtype": "bf16"}``), so this module needs no registry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from lab.measure.utilisation import peak_gflops

#: Below this share of its ceiling a speedup gets a why (the step is not GEMM-bound; the layer is too small;
#: overhead), above :data:`ABOVE_CEILING` one too (the arm changed more than the ceiling counts).
LOW_SHARE, ABOVE_CEILING = 0.5, 1.05
#: A baseline below this share of the fp32 GEMM peak is not GEMM-bound: a GEMM ratio cannot show in its time.
LOW_UTILISATION = 0.1
#: The phases the model's kernels run in: what a precision or a thinner model can speed up.
KERNEL_PHASES = ("forward", "backward")
_INF = math.inf


def gemm_ratio(card: Mapping[str, Any] | None, dtype: str, threads: int | None = None) -> float | None:
    """The card's GEMM peak in ``dtype`` over its fp32 peak at the same thread count (``None`` without both)."""
    peaks = [peak_gflops(dict(card or {}), d, threads) for d in (dtype, "fp32")]
    if peaks[0] is None or peaks[1] is None or peaks[1][0] <= 0:
        return None
    return peaks[0][0] / peaks[1][0]


def amdahl(phases_ms: Mapping[str, float], factors: Mapping[str, float], rest: float = 1.0) -> float | None:
    """The step's speedup if each phase ``p`` ran ``factors[p]`` times faster (``inf``: removed) and every
    other phase, and the time outside the named phases (``total`` minus their sum), ``rest`` times faster.
    ``None`` without a total."""
    parts = {p: float(t) for p, t in phases_ms.items() if p != "total" and t and t > 0}
    total = float(phases_ms.get("total") or sum(parts.values()))
    if total <= 0:
        return None
    outside = max(0.0, total - sum(parts.values()))
    after = outside / rest + sum(t / factors.get(p, rest) for p, t in parts.items())
    return total / after if after > 0 else _INF


def _part(overrides: Mapping[str, Any], axis: str, card: Mapping[str, Any] | None, threads: int | None,
          macs_ratio: float | None, int8_mac_share: float | None = None) -> dict[str, Any]:
    """One option's bound: ``{"factor", "phases" (None: the whole step or call), "basis"}`` or ``{"why"}``."""
    train = axis != "inference"
    kernel_phases = KERNEL_PHASES if train else None
    if "precision.dtype" in overrides:
        dtype = str(overrides["precision.dtype"])
        if dtype == "fp32":
            return {"factor": 1.0, "phases": None, "basis": "fp32: no change"}
        if not card:
            return {"why": "no card"}
        ratios = {d: gemm_ratio(card, d, threads) for d in (("bf16", "fp16") if dtype == "auto" else (dtype,))}
        ratios = {d: r for d, r in ratios.items() if r is not None}
        if not ratios:
            return {"why": f"the card has no {dtype} GEMM peak"}
        if dtype == "auto":
            best = max(ratios, key=ratios.__getitem__)
            factor = max(1.0, ratios[best])
            return {"factor": factor, "phases": kernel_phases,
                    "basis": f"auto: the best of fp32 / {' / '.join(ratios)} GEMM peaks "
                             f"({best} {ratios[best]:.2f}x fp32)"}
        return {"factor": ratios[dtype], "phases": kernel_phases,
                "basis": f"card: {dtype} GEMM peak {ratios[dtype]:.2f}x fp32"}
    if "quant.method" in overrides:
        if train:
            return {"why": "int8 after training changes inference, not the training step"}
        if not card:
            return {"why": "no card"}
        ratio = gemm_ratio(card, "int8", threads)
        if ratio is None:
            return {"why": "the card has no int8 GEMM peak"}
        if int8_mac_share is not None and 0 <= int8_mac_share <= 1:  # Amdahl over the MACs: float ones stay
            s = float(int8_mac_share)
            return {"factor": 1.0 / ((1.0 - s) + s / ratio), "phases": None,
                    "basis": f"card: int8 GEMM peak {ratio:.2f}x fp32 on the {s:.0%} of MACs in int8"}
        return {"factor": ratio, "phases": None, "basis": f"card: int8 GEMM peak {ratio:.2f}x fp32"}
    if "prune.method" in overrides:
        if overrides["prune.method"] != "structured_channels":
            return {"factor": 1.0, "phases": None, "basis": "unstructured masks: dense kernels skip no zeros (1x)"}
        if not macs_ratio or macs_ratio <= 0:
            return {"why": "the MACs ratio dense / pruned is not known"}
        return {"factor": float(macs_ratio), "phases": kernel_phases,
                "basis": f"MACs ratio dense / pruned {macs_ratio:.2f}x"}
    compute = sorted(k for k, v in overrides.items() if k.startswith("compute.") and v)
    if compute and compute != ["compute.fused_optimizer"]:
        return {"why": f"no ceiling from the card for {', '.join(compute)}: it removes overhead, not a kernel ratio"}
    if any(k.startswith("data.") for k in overrides):
        if not train:
            return {"why": "a loader changes training, not the inference call"}
        return {"factor": _INF, "phases": ("data_wait",), "basis": "ideal loader: the step with its data wait removed"}
    if overrides.get("compute.fused_optimizer"):
        if not train:
            return {"why": "a fused optimizer changes training, not the inference call"}
        return {"factor": _INF, "phases": ("optimizer",), "basis": "Amdahl: the optimizer phase removed"}
    keys = ", ".join(sorted(overrides)) or "nothing"
    return {"why": f"no ceiling from the card for {keys}: it removes overhead or trades time for memory, "
                   "not a kernel ratio"}


def technique_ceiling(parts: Sequence[Mapping[str, Any]], axis: str, *, card: Mapping[str, Any] | None,
                      threads: int | None = None, phases_ms: Mapping[str, float] | None = None,
                      macs_ratio: float | None = None, int8_mac_share: float | None = None) -> dict[str, Any]:
    """The ceiling of a technique (``parts``: each option's config overrides, one for a single option, several
    for a ``+`` stack) on ``axis`` (``train_step`` / ``train`` / ``inference``): ``{"ceiling", "basis"}``, or
    ``{"ceiling": None, "why"}``. On a training axis with ``phases_ms`` (the baseline's median per phase and
    ``total``) the parts' factors multiply per phase and combine by :func:`amdahl`; without phases the kernel
    ratios multiply over the whole step (a part that needs a phase then has no ceiling). ``int8_mac_share``: the
    share of the int8 model's MACs that run in int8 (the rest stay float), where known."""
    got = [_part(p, axis, card, threads, macs_ratio, int8_mac_share) for p in parts]
    missing = [g["why"] for g in got if "why" in g]
    if missing or not got:
        return {"ceiling": None, "why": "; ".join(dict.fromkeys(missing)) or "no technique"}
    basis = "; ".join(g["basis"] for g in got)
    phased = [g for g in got if g["phases"] is not None]
    if phased and phases_ms and phases_ms.get("total"):
        whole = math.prod(g["factor"] for g in got if g["phases"] is None)  # scales every phase alike
        factors: dict[str, float] = {}
        for g in phased:
            for p in g["phases"]:
                factors[p] = factors.get(p, whole) * g["factor"]
        ceiling = amdahl(phases_ms, factors, rest=whole)
        shares = {p: phases_ms.get(p, 0.0) / phases_ms["total"] for p in factors}
        return {"ceiling": ceiling, "basis": basis + "; Amdahl over the baseline's phases ("
                + ", ".join(f"{p} {s:.0%}" for p, s in shares.items()) + " of the step)"}
    if any(g["phases"] is not None and g["phases"] != KERNEL_PHASES for g in got):
        return {"ceiling": None, "why": "needs the step's measured phases (data wait, optimizer), which this "
                                        "record does not split"}
    ceiling = math.prod(g["factor"] for g in got)
    return {"ceiling": ceiling, "basis": basis + ("" if axis == "inference" else
                                                  " (the step not split into phases: the kernel ratio alone)")}


def share_of_ceiling(speedup: float | None, ceiling: float | None, *, utilisation: float | None = None,
                     regime: str | None = None) -> tuple[float | None, str]:
    """``(speedup / ceiling, why)``: ``why`` is empty unless the share is below :data:`LOW_SHARE` (then: the
    baseline is not GEMM-bound by its ``utilisation`` of the fp32 peak; the layer too small by its crossover
    ``regime``; else overhead) or above :data:`ABOVE_CEILING`. ``(None, why)`` without a speedup or a ceiling,
    and where the ceiling is below 1x (the technique cannot pay here: no headroom to share)."""
    if speedup is None or ceiling is None or not math.isfinite(speedup) or speedup <= 0:
        return None, "" if ceiling is not None else "no ceiling"
    if math.isinf(ceiling):
        return None, "no bound: the phase it removes was all of the step"
    if ceiling < 1.0:  # a share of a ceiling below 1x would read as headroom where there is none
        return None, f"the ceiling is {ceiling:.2g}x: this technique cannot pay on this machine"
    share = speedup / ceiling
    if share > ABOVE_CEILING:
        return share, ("above the ceiling: the arm changed more than the kernels the ceiling counts (compile, "
                       "fusion, a layout) or this model's GEMMs beat the card's at their size")
    if share >= LOW_SHARE:
        return share, ""
    if utilisation is not None and utilisation < LOW_UTILISATION:
        return share, (f"not GEMM-bound: the baseline ran at {utilisation:.1%} of the fp32 GEMM peak, so the "
                       "kernels the technique speeds are a small part of its time")
    if regime == "dispatch-bound":
        return share, "layer too small: the step is dispatch-bound (a fixed cost per op that no kernel ratio cuts)"
    if regime == "memory-bound":
        return share, "memory-bound: bytes moved, not multiply-accumulates, set the time"
    return share, ("overhead: what the ceiling does not count (casts, quantize / dequantize, ops left in fp32, "
                   "per-layer costs) takes the rest of the time")


#: The columns / keys a row that states a speedup gains (an ablation arm, a crossover row).
CEILING_KEYS = ("ceiling", "ceiling_basis", "share_of_ceiling", "share_why")


def config_parts(cfg: Mapping[str, Any], base_cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What an arm changes against its baseline, one overrides dict per family (``{"precision.dtype": "bf16"}``),
    read from the two runs' ``RunConfig.to_dict()``: the family sections only (a seed or a size is not a
    technique)."""
    parts: dict[str, dict[str, Any]] = {}
    for family, section in cfg.items():
        if isinstance(section, Mapping):
            base = base_cfg.get(family) or {}
            for key, value in section.items():
                if base.get(key) != value:
                    parts.setdefault(family, {})[f"{family}.{key}"] = value
    return list(parts.values())


def speedup_vs_ceiling(speedup: float | None, parts: Sequence[Mapping[str, Any]], axis: str, *,
                       card: Mapping[str, Any] | None, threads: int | None = None,
                       phases_ms: Mapping[str, float] | None = None, macs_ratio: float | None = None,
                       int8_mac_share: float | None = None, utilisation: float | None = None,
                       regime: str | None = None) -> dict[str, Any]:
    """The :data:`CEILING_KEYS` of one measured speedup: its ceiling (:func:`technique_ceiling`) with the basis
    (or why there is none), and the share of it measured with the why (:func:`share_of_ceiling`)."""
    got = technique_ceiling(parts, axis, card=card, threads=threads, phases_ms=phases_ms, macs_ratio=macs_ratio,
                            int8_mac_share=int8_mac_share)
    share, why = share_of_ceiling(speedup, got["ceiling"], utilisation=utilisation, regime=regime)
    return {"ceiling": got["ceiling"], "ceiling_basis": got.get("basis") or got.get("why"),
            "share_of_ceiling": share, "share_why": why if got["ceiling"] is not None else ""}


__all__ = ["ABOVE_CEILING", "CEILING_KEYS", "KERNEL_PHASES", "LOW_SHARE", "LOW_UTILISATION", "amdahl",
           "config_parts", "gemm_ratio", "share_of_ceiling", "speedup_vs_ceiling", "technique_ceiling"]
