"""The fair comparison for compiled int8: fp32 eager, fp32 compiled the same way, int8 compiled, interleaved.

Why two fp32 baselines: a PT2E int8 model is compiled by Inductor, and compilation alone speeds a model up
(fused elementwise ops, frozen weights, no Python between layers). Against fp32 *eager* the int8 figure mixes
the two gains; against fp32 *compiled with the same Inductor settings* (freezing on, static shapes,
:func:`lab.quant.pt2e.compile_frozen`) it is int8's own. Both are shown, every arm timed in the same
interleaved rounds (:func:`lab.measure.inference_latency_ms`), each with a bootstrap CI; compile seconds are
reported separately (a total that claims end-to-end time must add them). Theory sits beside practice: the
share of MACs that run int8 gives an Amdahl bound on the speedup over fp32 compiled, and a why tag says
where the measurement and the bound disagree. Used by :mod:`lab.quant.report`, the benchmark and notebook 04.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lab import measure
from lab.quant.graph import graph_layer_bytes
from lab.quant.pt2e import FrozenCompiled, compile_frozen, converted_graph
from lab.quant.storage import bytes_by_role
from lab.quant.swap import is_conv1d

#: int8 multiply-accumulates per instruction over fp32 ones on x86 (VNNI / AMX-INT8 against FMA): the most
#: an int8 kernel can gain on the MACs it runs.
INT8_MAC_GAIN = 4.0
#: Below this share of the model's MACs in int8 layers, a compiled int8 model's gain over fp32 eager is not
#: int8's: it is said to be compilation's (HF ResNet's dynamic int8 once read 2.30x with 0 % int8 MACs).
MIN_INT8_MAC_SHARE = 0.2


def int8_macs(float_model: nn.Module, swapped: Sequence[str], example_inputs: tuple[torch.Tensor, ...]) -> int:
    """MACs of one forward of ``example_inputs`` in the layers that run int8 (conv / linear: output positions
    x weight entries), counted on the float model by path, since the compiled int8 kernels are opaque."""
    names = set(swapped)
    total = {"macs": 0}

    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        w = module.weight
        per = output.shape[1] if isinstance(module, nn.Conv1d | nn.Conv2d) else output.shape[-1]
        total["macs"] += (output.numel() // per) * w.numel()

    handles = [m.register_forward_hook(hook) for n, m in float_model.named_modules()
               if n in names and (isinstance(m, nn.Linear | nn.Conv1d | nn.Conv2d) or is_conv1d(m))]
    with measure.hooks_removed(handles), measure.evaluation_mode(float_model):
        float_model(*example_inputs)
    return total["macs"]


def amdahl_bound(int8_share: float, gain: float = INT8_MAC_GAIN) -> float:
    """The speedup over fp32 if only the int8 share of the MACs got ``gain`` x faster and nothing else moved."""
    return 1.0 / ((1.0 - int8_share) + int8_share / gain)


def _speedup(base_ms: Sequence[float], variant_ms: Sequence[float]) -> dict[str, float]:
    ratio, lo, hi = measure.bootstrap_ratio_ci(base_ms, variant_ms)
    return {"ratio": ratio, "ci_lo": lo, "ci_hi": hi, "base_median_ms": measure.median(base_ms),
            "variant_median_ms": measure.median(variant_ms)}


def compiled_latency(float_model: nn.Module, quantized: FrozenCompiled, inputs: tuple[torch.Tensor, ...],
                     batch_sizes: Sequence[int], repeats: int,
                     fp32_compiled: FrozenCompiled | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per batch size: int8 compiled vs fp32 eager (``ratio``) and vs fp32 compiled (``vs_fp32_compiled``),
    interleaved; and the compile seconds of both compiled arms per batch size (first call, not in latency)."""
    fp32_compiled = fp32_compiled or compile_frozen(float_model)
    for b in sorted(batch_sizes, reverse=True):  # the large size first: it becomes the bucket of both
        x = tuple(t[:b] for t in inputs)
        quantized(*x), fp32_compiled(*x)
    latency: dict[str, Any] = {}
    for b in sorted(batch_sizes):
        x = tuple(t[:b] for t in inputs)
        s = measure.inference_latency_ms({"fp32_eager": float_model, "fp32_compiled": fp32_compiled,
                                          "int8": quantized}, x, repeats=repeats, warmup=2)
        latency[f"batch_{b}"] = {**_speedup(s["fp32_eager"], s["int8"]),
                                 "vs_fp32_compiled": _speedup(s["fp32_compiled"], s["int8"]),
                                 "fp32_compiled_vs_eager": _speedup(s["fp32_eager"], s["fp32_compiled"]),
                                 "samples_ms": s}
    compile_s = {"int8": dict(quantized.compile_s), "fp32_compiled": dict(fp32_compiled.compile_s)}
    return latency, compile_s


def theory_vs_practice(int8_share: float, latency: dict[str, Any], float_ops: dict[str, int]) -> dict[str, Any]:
    """The Amdahl bound from the int8 MAC share beside the measured speedup over fp32 compiled, per batch size,
    with a why tag where they disagree (below half the bound, above it, or slower than fp32)."""
    bound = amdahl_bound(int8_share)
    left = ", ".join(f"{k} x{v}" for k, v in float_ops.items()) or "none"
    rows: dict[str, Any] = {}
    for key, s in latency.items():
        got = s["vs_fp32_compiled"]["ratio"]
        why = None
        if got < 1.0:
            why = ("int8 slower than fp32 compiled: "
                   + ("at batch 1 quantize / dequantize and kernel dispatch dominate a tiny GEMM"
                      if key == "batch_1" else f"layers too small for int8 GEMMs to win; ops left float: {left}"))
        elif got < 0.5 * bound:
            why = (f"below half the MAC bound ({bound:.2f}x): per-layer overhead at this size and quantize / "
                   f"dequantize at float borders (ops left float: {left})")
        elif got > 1.1 * bound:
            why = (f"above the MAC bound ({bound:.2f}x): int8 also moves 4x fewer weight and activation bytes "
                   "(uint8 activations between fused kernels), so memory-bound layers gain more than MACs predict")
        rows[key] = {"measured_vs_fp32_compiled": got, "mac_bound": bound, "why": why}
    return {"int8_mac_share": int8_share, "int8_mac_gain_assumed": INT8_MAC_GAIN, "by_batch": rows}


def compare_compiled(float_model: nn.Module, quantized: FrozenCompiled, inputs: tuple[torch.Tensor, ...],
                     swapped: Sequence[str], *, batch_n: int, repeats: int,
                     float_ops: dict[str, int] | None = None) -> dict[str, Any]:
    """Size, MACs, interleaved latency against both fp32 baselines, compile time and theory-vs-practice for a
    compiled PT2E int8 model (the accuracy figures are added by the caller)."""
    one = tuple(t[:1] for t in inputs)
    f_bytes, q_bytes = measure.serialized_size_bytes(float_model), measure.serialized_size_bytes(quantized)
    graph = converted_graph(quantized)
    lf, lq = graph_layer_bytes(graph) if graph is not None else (0, 0)
    f_macs = measure.count_macs(float_model, one)
    q_macs = int8_macs(float_model, swapped, one)
    out: dict[str, Any] = {
        "float_bytes": f_bytes, "int8_bytes": q_bytes, "size_ratio": f_bytes / q_bytes,
        "quantized_layers_float_bytes": lf, "quantized_layers_int8_bytes": lq,
        "quantized_layers_size_ratio": lf / lq if lq else float("nan"),
        "bytes_by_role": bytes_by_role(quantized, swapped, graph),
        "float_macs_per_sample": f_macs, "int8_macs_per_sample": q_macs,
        "int8_model_macs_by_dtype": {"fp32": f_macs - q_macs, "int8": q_macs}, "latency": {}}
    if repeats:
        sizes = sorted({1, min(batch_n, len(inputs[0]))})
        out["latency"], out["compile_s"] = compiled_latency(float_model, quantized, inputs, sizes, repeats)
        out["theory"] = theory_vs_practice(q_macs / f_macs if f_macs else 0.0, out["latency"], float_ops or {})
    return out


def compilation_credit(figures: dict[str, Any]) -> str | None:
    """"not an int8 speedup" when under :data:`MIN_INT8_MAC_SHARE` of the MACs run int8 (a compiled int8 model's
    gain over fp32 eager is then compilation's), with both ratios at the largest batch; ``None`` otherwise."""
    theory = figures.get("theory") or {}
    share = theory.get("int8_mac_share")
    lat = figures.get("latency") or {}
    if share is None or share >= MIN_INT8_MAC_SHARE or not lat:
        return None
    key = max(lat, key=lambda k: int(k.split("_")[-1]))
    row = lat[key]
    return (f"not an int8 speedup: the gain is compilation's ({share:.0%} of the MACs run int8, under "
            f"{MIN_INT8_MAC_SHARE:.0%}; at {key} {row['ratio']:.2f}x over fp32 eager, "
            f"{row['vs_fp32_compiled']['ratio']:.2f}x over fp32 compiled the same way)")


def why_tags_compiled(figures: dict[str, Any], swap: dict[str, Any]) -> list[str]:
    """Plain-language reasons where compiled int8 did not pay off (or beat theory), for ``result.why``."""
    theory = figures.get("theory") or {}
    tags = [f"int8 vs fp32 compiled at {key} ({row['measured_vs_fp32_compiled']:.2f}x): {row['why']}"
            for key, row in theory.get("by_batch", {}).items() if row["why"]]
    credit = compilation_credit(figures)
    if credit:
        tags.insert(0, credit)
    if swap["kept_float"]:
        tags.append("stayed float: " + "; ".join(f"{n} ({swap['kept_float_reasons'].get(n, '?')})"
                                                 for n in swap["kept_float"]))
    return tags


__all__ = ["amdahl_bound", "compare_compiled", "compilation_credit", "MIN_INT8_MAC_SHARE", "compiled_latency",
           "int8_macs", "INT8_MAC_GAIN",
           "theory_vs_practice", "why_tags_compiled"]
