"""Float vs int8, measured the lab's way: size, interleaved latency with CIs, accuracy delta with its noise
floor, output error, MACs, and the training-time cost of QAT.

Why a separate module: :mod:`lab.quant.int8` decides *how* to quantize; this decides whether it paid
off, and every figure is taken against the float model the run just trained, on the same inputs, with the
arms interleaved (float, int8, float, int8, ...) by :func:`lab.measure.inference_latency_ms` so that load
from other processes hits both alike. Used by ``lab.quant.after_training``, ``notebooks/04_quantization``
and the benchmark.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from lab import measure
from lab.config import QuantConfig, RunConfig
from lab.context import TrainContext, prepare
from lab.quant.fair import compare_compiled, why_tags_compiled
from lab.quant.int8 import quantize
from lab.quant.pt2e import FrozenCompiled
from lab.quant.storage import bytes_by_role
from lab.workloads import Workload


def interleaved_latency_ms(models: dict[str, nn.Module], inputs: tuple[torch.Tensor, ...], repeats: int,
                           warmup: int = 2) -> dict[str, list[float]]:
    """Per-call latency samples of every model on the same inputs, arms interleaved per repeat (the one
    timer, :func:`lab.measure.inference_latency_ms`)."""
    return measure.inference_latency_ms(models, inputs, repeats=repeats, warmup=warmup)


def speedup(base_ms: Sequence[float], variant_ms: Sequence[float]) -> dict[str, float]:
    """Ratio of medians base / variant (> 1: the variant is faster) with a bootstrap 95 % CI."""
    ratio, lo, hi = measure.bootstrap_ratio_ci(base_ms, variant_ms)
    return {"ratio": ratio, "ci_lo": lo, "ci_hi": hi, "base_median_ms": measure.median(base_ms),
            "variant_median_ms": measure.median(variant_ms)}


def layer_bytes(float_model: nn.Module, quantized: nn.Module, names: Sequence[str]) -> tuple[int, int]:
    """Serialized bytes of the named layers in the float and the int8 model (one ``torch.save`` each, so
    per-file overhead is paid once): the "quantized layers" size, without the parts left float."""
    def size(model: nn.Module) -> int:
        mods = dict(model.named_modules())
        buf = io.BytesIO()
        torch.save({n: mods[n].state_dict() for n in names if n in mods}, buf)
        return buf.getbuffer().nbytes
    return size(float_model), size(quantized)


@torch.no_grad()
def outputs_of(model: nn.Module, inputs: tuple[torch.Tensor, ...], batch_size: int = 512) -> torch.Tensor:
    """Model outputs over a whole split in eval mode, on CPU, as float32."""
    model.eval()
    n = len(inputs[0])
    return torch.cat([model(*(t[i:i + batch_size] for t in inputs)).float()
                      for i in range(0, n, batch_size)])


def metric_delta(evaluate: Callable[[torch.Tensor, torch.Tensor], dict[str, float]], metric: str,
                 base_out: torch.Tensor, variant_out: torch.Tensor, target: torch.Tensor, *,
                 higher_is_better: bool = True, n_boot: int = 100, seed: int = 0) -> dict[str, Any]:
    """Metric loss base - variant in percentage points (positive = int8 is worse) with a paired bootstrap
    95 % CI over test samples: the noise floor a delta must clear before it means anything."""
    sign = 100.0 if higher_is_better else -100.0
    delta = sign * (evaluate(base_out, target)[metric] - evaluate(variant_out, target)[metric])
    rng = np.random.default_rng(seed)
    n = len(target)
    boots = []
    for _ in range(n_boot):
        idx = torch.from_numpy(rng.integers(0, n, n))
        boots.append(sign * (evaluate(base_out[idx], target[idx])[metric]
                             - evaluate(variant_out[idx], target[idx])[metric]))
    lo, hi = (float(v) for v in np.nanpercentile(boots, [2.5, 97.5]))
    return {"loss_pts": float(delta), "ci_lo": lo, "ci_hi": hi, "within_noise": bool(lo <= 0.0 <= hi)}


def relative_error(base_out: torch.Tensor, variant_out: torch.Tensor) -> float:
    """||int8 - float|| / ||float|| over all outputs."""
    base_out, variant_out = base_out.detach().float(), variant_out.detach().float()
    return float((variant_out - base_out).norm() / base_out.norm().clamp_min(1e-12))


def compare(float_model: nn.Module, quantized: nn.Module, wl: Workload, test: tuple[torch.Tensor, ...], *,
            swapped: Sequence[str], batch_n: int, repeats: int,
            float_ops: dict[str, int] | None = None) -> dict[str, Any]:
    """Everything float-vs-int8 that needs no training context (the benchmark and notebook call this). A
    compiled PT2E model is timed against fp32 eager *and* fp32 compiled (:func:`lab.quant.fair.compare_compiled`,
    which compiles first, so its batch sizes become the compiled graphs); a legacy one against fp32 eager."""
    inputs, target = test[:-1], test[-1]
    if isinstance(quantized, FrozenCompiled):
        out = compare_compiled(float_model, quantized, inputs, swapped, batch_n=batch_n, repeats=repeats,
                               float_ops=float_ops)
    else:
        out = _compare_eager(float_model, quantized, inputs, swapped=swapped, batch_n=batch_n, repeats=repeats)
    f_out, q_out = outputs_of(float_model, inputs), outputs_of(quantized, inputs)
    out["output_rel_error"] = relative_error(f_out, q_out)
    out["accuracy"] = {wl.metric_name: metric_delta(wl.evaluate, wl.metric_name, f_out, q_out, target,
                                                    higher_is_better=wl.higher_is_better)}
    return out


def _compare_eager(float_model: nn.Module, quantized: nn.Module, inputs: tuple[torch.Tensor, ...], *,
                   swapped: Sequence[str], batch_n: int, repeats: int) -> dict[str, Any]:
    f_bytes, q_bytes = measure.serialized_size_bytes(float_model), measure.serialized_size_bytes(quantized)
    lf, lq = layer_bytes(float_model, quantized, swapped)
    one = tuple(t[:1] for t in inputs)
    out: dict[str, Any] = {
        "float_bytes": f_bytes, "int8_bytes": q_bytes, "size_ratio": f_bytes / q_bytes,
        "quantized_layers_float_bytes": lf, "quantized_layers_int8_bytes": lq,
        "quantized_layers_size_ratio": lf / lq if lq else float("nan"),
        "bytes_by_role": bytes_by_role(quantized, swapped),
        "float_macs_per_sample": measure.count_macs(float_model, one),
        "int8_macs_counted": measure.count_macs(quantized, one),  # float and int8 kernels of the int8 model
        "int8_model_macs_by_dtype": measure.count_macs_by_dtype(quantized, one),
        "latency": {},
    }
    if repeats:
        for b in sorted({1, min(batch_n, len(inputs[0]))}):
            x = tuple(t[:b] for t in inputs)
            s = interleaved_latency_ms({"float": float_model, "int8": quantized}, x, repeats)
            out["latency"][f"batch_{b}"] = {**speedup(s["float"], s["int8"]), "samples_ms": s}
    return out


def why_tags(figures: dict[str, Any], swap: dict[str, Any]) -> list[str]:
    """Plain-language reasons where int8 did not pay off, for ``result.why``."""
    tags = []
    int8_lstm = any(t == "LSTM" for t in swap["swapped"].values())
    for key, s in figures.get("latency", {}).items():
        if s["ratio"] >= 1.0:
            continue
        if int8_lstm:
            reason = "kernel missing: the dynamic int8 LSTM does not beat fp32's fused LSTM kernel"
        elif key == "batch_1":
            reason = "small batch: quantize/dequantize and packing overhead dominate a tiny GEMM"
        elif swap["kept_float"]:
            reason = "partly float: time goes to layers left float and quantize/dequantize at their borders"
        else:
            reason = "memory-bound: int8 saves bytes, but these layers are too small for int8 GEMMs to win"
        tags.append(f"int8 slower than fp32 at {key} ({s['ratio']:.2f}x): {reason}")
    if swap["kept_float"]:
        tags.append(f"stayed float: {', '.join(swap['kept_float'])}")
    return tags


def measure_against_float(ctx: TrainContext, float_model: nn.Module, quantized: nn.Module, info: dict[str, Any],
                          qat_stats: dict[str, Any]) -> None:
    """Fill ``info`` (-> ``result.details["quant"]``) and ``result.why`` for a lab run."""
    cfg = ctx.cfg
    batch_n = min(cfg.eval_batch_size, len(ctx.data.test[0]))
    figs = compare(float_model.cpu(), quantized, ctx.workload, ctx.data.test, swapped=list(info["swap"]["swapped"]),
                   batch_n=batch_n, repeats=cfg.latency_repeats, float_ops=info["swap"].get("float_ops"))
    if qat_stats:
        warm = cfg.warmup_steps
        qat_ms = measure.median(qat_stats["step_ms"][warm:] or qat_stats["step_ms"])
        train_ms = ctx.result.step_times_ms.get("total", [])
        float_ms = measure.median(train_ms[warm:] or train_ms) if train_ms else float("nan")
        figs["qat"] = {"steps": qat_stats["steps"], "time_s": qat_stats["time_s"], "step_median_ms": qat_ms,
                       "float_step_median_ms": float_ms, "qat_step_cost_ratio": qat_ms / float_ms,
                       "note": "fake-quant makes training steps slower; int8 speeds up inference, not training"}
    info.update(figs)
    tags = why_tags_compiled if isinstance(quantized, FrozenCompiled) else why_tags
    ctx.result.why.extend(tags(figs, info["swap"]))
    if info.get("flow_fallback"):
        ctx.result.why.append(f"quant.flow='pt2e' fell back to legacy: {info['flow_fallback']}")


# ----------------------------------------------------------------------------- studies (notebook, bench)


def trained_float_model(cfg: RunConfig) -> tuple[nn.Module, TrainContext]:
    """Train ``cfg``'s workload in fp32 exactly as :func:`lab.run` does (:func:`lab.context.prepare`, the same
    seeds, the same ``ctx.fit``) and return the model with its context, so several quantization variants
    can start from *one* float model."""
    with prepare(cfg) as ctx:
        model = ctx.new_model()
        stats = ctx.fit(model, epochs=ctx.resolved.epochs, lr=ctx.resolved.lr, max_steps=cfg.max_steps)
    ctx.result.step_times_ms = stats.step_times_ms
    return model.eval(), ctx


def calibration_ablation(model: nn.Module, ctx: TrainContext, batches: Sequence[int] = (1, 4, 16, 64),
                         observers: Sequence[str] = ("minmax", "histogram")) -> list[dict[str, Any]]:
    """Static int8 accuracy vs number of calibration batches and observer type, against the float model
    (legacy flow: the observers are its choice to make)."""
    wl, test = ctx.workload, ctx.data.test
    f_out = outputs_of(model, test[:-1])
    base = wl.evaluate(f_out, test[-1])[wl.metric_name]
    rows = []
    for obs in observers:
        for n in batches:
            # the legacy flow: it has the observers to compare (X86InductorQuantizer's default is histogram)
            q = quantize(model, QuantConfig(method="static", calibration_batches=n, observer=obs, flow="legacy"),
                         ctx.make_loader())
            q_out = outputs_of(q, test[:-1])
            metric = wl.evaluate(q_out, test[-1])[wl.metric_name]
            rows.append({"observer": obs, "calibration_batches": n, "float_metric": base, "int8_metric": metric,
                         "loss_pts": 100 * (base - metric), "output_rel_error": relative_error(f_out, q_out)})
    return rows


def summary_row(label: str, quant: dict[str, Any], metric_name: str) -> dict[str, Any]:
    """One flat row (for a table or a plot) from a ``details["quant"]``-shaped dict."""
    acc = quant["accuracy"][metric_name]
    row: dict[str, Any] = {"arm": label, "method": quant.get("method"), "size_ratio": quant["size_ratio"],
                           "layers_size_ratio": quant["quantized_layers_size_ratio"],
                           "loss_pts": acc["loss_pts"], "loss_ci": (acc["ci_lo"], acc["ci_hi"]),
                           "within_noise": acc["within_noise"], "output_rel_error": quant["output_rel_error"],
                           "kept_float": ", ".join(quant["swap"]["kept_float"])}
    for key, s in quant.get("latency", {}).items():
        row[f"speedup_{key}"] = s["ratio"]
        row[f"speedup_{key}_ci"] = (s["ci_lo"], s["ci_hi"])
    if "qat" in quant:
        row["qat_step_cost_ratio"] = quant["qat"]["qat_step_cost_ratio"]
    return row

#: A PTQ gap below this is no loss by the lab's own tolerance (the stacked goals' "<= 0.5 pt loss"): nothing to
#: recover however tight its CI. ctr's AUC is deterministic on a fixed test set, so a 0.02-pt gap can have a CI
#: above 0, and QAT's extra epoch then "recovers" 1700 % of it.
MIN_RECOVERABLE_GAP_PTS = 0.5


def qat_recovery(fp32: Sequence[float], ptq: Sequence[float], qat: Sequence[float], *,
                 min_gap_pts: float = MIN_RECOVERABLE_GAP_PTS) -> dict[str, Any]:
    """The PTQ accuracy gap over seeds and the share of it QAT wins back (metrics in [0, 1], one per seed).

    ``gap`` (points, mean over seeds) with its Student-t 95 % CI; ``real_gap`` when that CI is above 0 *and* the
    gap is at least ``min_gap_pts``; only then ``share`` = mean over the seeds where PTQ lost of
    ``(QAT - PTQ) / (fp32 - PTQ)`` in %, with its CI, and ``pooled`` (sums over those seeds). Otherwise the share
    is NaN: a share of a gap that is not there is noise divided by noise."""
    if not len(fp32) == len(ptq) == len(qat) or not fp32:
        raise ValueError(f"one fp32, PTQ and QAT metric per seed: got {len(fp32)}, {len(ptq)}, {len(qat)}")
    nan = float("nan")
    gap, lo, hi = measure.mean_t_ci(100 * (f - p) for f, p in zip(fp32, ptq, strict=True))
    real = not np.isnan(lo) and lo > 0 and gap >= min_gap_pts
    out: dict[str, Any] = {"gap": gap, "gap_ci": (lo, hi), "real_gap": real, "share": nan, "share_ci": (nan, nan),
                           "pooled": nan, "n_with_gap": 0}
    if real:
        lost = [(f, p, q) for f, p, q in zip(fp32, ptq, qat, strict=True) if f > p]
        share, slo, shi = measure.mean_t_ci(100 * (q - p) / (f - p) for f, p, q in lost)
        pooled = 100 * sum(q - p for f, p, q in lost) / sum(f - p for f, p, q in lost)
        out.update(share=share, share_ci=(slo, shi), pooled=pooled, n_with_gap=len(lost))
    return out


__all__ = [
    "calibration_ablation", "compare", "interleaved_latency_ms", "layer_bytes", "measure_against_float",
    "metric_delta", "MIN_RECOVERABLE_GAP_PTS", "outputs_of", "qat_recovery", "relative_error", "speedup",
    "summary_row", "trained_float_model", "why_tags",
]
