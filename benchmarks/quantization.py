"""int8 vs the strongest fp32 on all three workloads: latency, size, accuracy, and what QAT buys and costs.

    python benchmarks/quantization.py [--quick] [--json PATH]

Per workload one float model is trained (threads=1), then quantized dynamically and (CTR, ResNet) statically
with calibration; the ResNet also gets QAT and, for a fair cost comparison, plain float fine-tuning of the
same length. Latency arms are interleaved (fp32, fp32 channels_last, int8 ..., repeated) at batch 1 and batch
64; the fp32 reference is the faster of plain and channels_last, not a weak baseline. Goals (DESIGN §5,
issue 6): int8 >= 2.5x fp32 at batch >= 32 on the Linear/conv-heavy models with <= 0.5 pt accuracy loss;
quantized layers >= 3.95x smaller; QAT recovers >= 50 % of the PTQ accuracy gap. torchao's CUDA weight-only
path is not benchmarked here (torchao is not a dependency yet; a later issue).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from _common import emit, figure, parse_args

from lab import RunConfig
from lab.config import QuantConfig
from lab.measure import median
from lab.quant_report import interleaved_latency_ms, layer_bytes, metric_delta, outputs_of, speedup, trained_float_model
from lab.quantization import quantize_with_report
from lab.train import thread_count

BATCH_N = 64
PLANS = {"ctr": ("dynamic", "static"), "sequence": ("dynamic",), "vision": ("dynamic", "static", "qat")}
HEAVY = {("vision", "static"), ("vision", "qat"), ("ctr", "dynamic"), ("ctr", "static")}


def _channels_last(model: torch.nn.Module, inputs: tuple) -> tuple[torch.nn.Module, tuple] | None:
    if inputs[0].dim() != 4:
        return None
    return copy.deepcopy(model).to(memory_format=torch.channels_last), (
        inputs[0].contiguous(memory_format=torch.channels_last), *inputs[1:])


def bench_workload(name: str, size: str, repeats: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    cfg = RunConfig(workload=name, size=size, threads=1, device="cpu")
    model, ctx = trained_float_model(cfg)
    wl, test = ctx.workload, ctx.data.test
    f_out = outputs_of(model, test[:-1])
    arms: dict[str, Any] = {}
    qat_extra: dict[str, Any] = {}
    for method in PLANS[name]:
        qc = QuantConfig(method=method, qat_epochs=1)
        finetune = None
        if method == "qat":
            def finetune(m: torch.nn.Module, lr: float = ctx.resolved.lr * qc.qat_lr_factor) -> None:
                qat_extra["qat"] = ctx.fit(m, epochs=1, lr=lr, phase="qat")
        with thread_count(1):
            q, info = quantize_with_report(model, qc, ctx.make_loader(), finetune=finetune,
                                           example_inputs=tuple(t[:2] for t in ctx.data.train[:-1]))
        arms[method] = (q, info)
    figs, raw = [], {}
    with thread_count(1):
        if "qat" in arms:  # plain float fine-tuning of the same length: the fair reference for QAT's cost
            ft = copy.deepcopy(model)
            qat_extra["ft"] = ctx.fit(ft, epochs=1, lr=ctx.resolved.lr * QuantConfig().qat_lr_factor, phase="finetune")
            qat_extra["ft_metric"] = wl.evaluate(outputs_of(ft, test[:-1]), test[-1])[wl.metric_name]
        for b in (1, BATCH_N):
            x = tuple(t[:b] for t in test[:-1])
            models = {"fp32": model, **{m: q for m, (q, _) in arms.items()}}
            inputs = {k: x for k in models}
            cl = _channels_last(model, x)
            if cl:
                models["fp32_channels_last"], inputs["fp32_channels_last"] = cl
            samples = {k: [] for k in models}
            for _ in range(repeats):  # interleave whole rounds too, so slow drift spreads over every arm
                for k, m in models.items():
                    samples[k] += interleaved_latency_ms({k: m}, inputs[k], 1, warmup=1 if _ == 0 else 0)[k]
            best = min((k for k in samples if k.startswith("fp32")), key=lambda k: median(samples[k]))
            raw[f"batch_{b}"] = samples
            for method in arms:
                s = speedup(samples[best], samples[method])
                heavy = (name, method) in HEAVY and b >= 32
                acc = metric_delta(wl.evaluate, wl.metric_name, f_out, outputs_of(arms[method][0], test[:-1]),
                                   test[-1], higher_is_better=wl.higher_is_better)
                ok = s["ratio"] >= 2.5 and acc["loss_pts"] <= 0.5 if heavy else None
                figs.append(figure(f"{name} {method} speedup vs {best}, batch {b}", s["ratio"], unit="x",
                                   ci=(s["ci_lo"], s["ci_hi"]), goal=">= 2.5x with <= 0.5 pt loss" if heavy else None,
                                   met=ok, note=f"loss {acc['loss_pts']:.2f} pts [{acc['ci_lo']:.2f}, "
                                   f"{acc['ci_hi']:.2f}]; fp32 {s['base_median_ms']:.3f} ms"))
    for method, (q, info) in arms.items():
        lf, lq = layer_bytes(model, q, list(info["swap"]["swapped"]))
        figs.append(figure(f"{name} {method} quantized-layers size ratio", lf / lq, unit="x", goal=">= 3.95x",
                           met=lf / lq >= 3.95, note=f"kept float: {', '.join(info['swap']['kept_float']) or '-'}"))
    if "qat" in arms:
        figs += _qat_figures(name, wl, test, model, arms, qat_extra)
    return figs, raw


def _qat_figures(name: str, wl: Any, test: tuple, model: torch.nn.Module, arms: dict, extra: dict) -> list[dict]:
    metric = {k: wl.evaluate(outputs_of(m, test[:-1]), test[-1])[wl.metric_name]
              for k, m in (("fp32", model), ("static", arms["static"][0]), ("qat", arms["qat"][0]))}
    gap = metric["fp32"] - metric["static"]
    recovered = (metric["qat"] - metric["static"]) / gap if gap > 0 else float("nan")
    cost = median(extra["qat"].step_times_ms["total"][3:]) / median(extra["ft"].step_times_ms["total"][3:])
    return [
        figure(f"{name} QAT recovery of the PTQ gap", 100 * recovered, unit="%", goal=">= 50 %",
               met=recovered >= 0.5 if gap > 0 else None,
               note=f"fp32 {metric['fp32']:.4f}, PTQ {metric['static']:.4f}, QAT {metric['qat']:.4f}, fp32+same "
               f"fine-tune {extra['ft_metric']:.4f}; the gap is {round(gap * len(test[-1]))} of {len(test[-1])} "
               "test samples, so this ratio is coarse" + ("" if gap > 0 else "; PTQ lost nothing, goal n/a")),
        figure(f"{name} QAT step / plain fine-tune step", cost, unit="x",
               note="fake-quant slows training: int8 does not speed up training"),
    ]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    size, repeats = ("tiny", 10) if args.quick else ("small", 20)
    figures, raw = [], {}
    for name in PLANS:
        figs, raw[name] = bench_workload(name, size, repeats)
        figures += figs
    figures.append(figure("torchao int8/int4 weight-only on CUDA, batch 1", float("nan"), unit="x",
                          note="not here: measured by benchmarks/gpu.sh on a CUDA machine (gpu.json)"))
    emit("quantization", args, figures, samples_ms=raw, engine=torch.backends.quantized.engine,
         settings={"size": size, "repeats": repeats, "threads": 1, "batch_n": BATCH_N})


if __name__ == "__main__":
    main()
