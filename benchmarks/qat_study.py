"""QAT recovery study: the share of the PTQ (static int8) accuracy gap that QAT recovers, over seeds, with a CI.

    python benchmarks/qat_study.py [--quick] [--json PATH] [--workload vision] [--size tiny] [--scale xs]
                                   [--seeds 3] [--calibration-batches N]

Per seed: one float model trained exactly as ``lab run`` does (:func:`lab.quant.trained_float_model`), then
PT2E static int8 (X86InductorQuantizer, calibrated on the training loader), PT2E QAT (fake-quant fine-tune of
``qat_epochs`` at lr x ``qat_lr_factor``, the lab's defaults) and, as the control QAT must beat, the float
model fine-tuned the same way without fake-quant. Accuracy is read on the held-out test split from the
converted int8 graphs run eagerly (they compute what the compiled ones compute; compiling would only add
minutes). Per seed: gap = fp32 - PTQ, recovered = (QAT - PTQ) / gap; across seeds the mean recovery with a
Student-t 95 % CI (3 seeds: wide, and it says so), and the pooled ratio (sum over seeds) beside it. A seed
whose PTQ lost nothing has no gap to recover and is reported, not divided by; and unless the gap's CI over
seeds is above 0 no share is computed at all (noise divided by noise). Goal (issue 6 / 30): QAT
recovers >= 50 % of the PTQ gap. Choose a workload / scale where PTQ loses accuracy (the default: the
narrowest vision ResNet, xs), otherwise the study says nothing.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from typing import Any

import numpy as np
import torch
from _common import emit, figure
from torch import nn

from lab import RunConfig
from lab.config import QuantConfig
from lab.context import thread_count
from lab.quant import converted_graph, outputs_of, quantize_with_report, trained_float_model

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 seeds, tiny sizes")
    p.add_argument("--json", metavar="PATH", help="write the figures here")
    p.add_argument("--workload", default="vision")
    p.add_argument("--size", default="tiny")
    p.add_argument("--scale", default="xs", help="model scale (lab's --model-scale); '' for the size's own")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--calibration-batches", type=int, default=QuantConfig().calibration_batches)
    return p.parse_args()


def _metric(ctx: Any, model: nn.Module) -> float:
    wl, test = ctx.workload, ctx.data.test
    return float(wl.evaluate(outputs_of(model, test[:-1]), test[-1])[wl.metric_name])


def one_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    cfg = RunConfig(workload=args.workload, size=args.size, model_scale=args.scale or None, seed=seed, threads=1,
                    device="cpu")
    t0 = time.perf_counter()
    model, ctx = trained_float_model(cfg)
    qc = QuantConfig(method="static", calibration_batches=args.calibration_batches)
    lr = ctx.resolved.lr * qc.qat_lr_factor
    with thread_count(1):
        ptq, _ = quantize_with_report(model, qc, ctx.make_loader(),
                                      example_inputs=tuple(t[:2] for t in ctx.data.train[:-1]))

        def finetune(m: nn.Module) -> None:
            ctx.fit(m, epochs=qc.qat_epochs, lr=lr, phase="qat")

        qat, _ = quantize_with_report(model, QuantConfig(method="qat", qat_epochs=qc.qat_epochs), ctx.make_loader(),
                                      finetune=finetune, example_inputs=tuple(t[:2] for t in ctx.data.train[:-1]))
        ft = copy.deepcopy(model).train()
        ctx.fit(ft, epochs=qc.qat_epochs, lr=lr, phase="finetune")
    row = {"seed": seed, "fp32": _metric(ctx, model), "ptq": _metric(ctx, converted_graph(ptq)),
           "qat": _metric(ctx, converted_graph(qat)), "fp32_finetuned": _metric(ctx, ft.eval()),
           "n_test": len(ctx.data.test[-1]), "seconds": time.perf_counter() - t0}
    gap = row["fp32"] - row["ptq"]
    row["gap_pts"] = 100 * gap
    row["recovered"] = (row["qat"] - row["ptq"]) / gap if gap > 0 else None
    print(f"seed {seed}: fp32 {row['fp32']:.4f} PTQ {row['ptq']:.4f} QAT {row['qat']:.4f} "
          f"fp32+ft {row['fp32_finetuned']:.4f} ({row['seconds']:.0f} s)", flush=True)
    return row


def t_ci(values: list[float]) -> tuple[float, float, float]:
    """Mean and Student-t 95 % CI over seeds (nan bounds for one value)."""
    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean()) if len(arr) else float("nan")
    if len(arr) < 2:
        return mean, float("nan"), float("nan")
    half = T975.get(len(arr) - 1, 1.96) * float(arr.std(ddof=1)) / math.sqrt(len(arr))
    return mean, mean - half, mean + half


def main() -> None:
    args = _args()
    seeds = 2 if args.quick else args.seeds
    torch.set_num_threads(1)
    rows = [one_seed(args, s) for s in range(seeds)]
    with_gap = [r for r in rows if r["recovered"] is not None]
    rec, lo, hi = t_ci([100 * r["recovered"] for r in with_gap])
    pooled_gap = sum(r["fp32"] - r["ptq"] for r in rows)
    pooled = 100 * sum(r["qat"] - r["ptq"] for r in rows) / pooled_gap if pooled_gap > 0 else float("nan")
    gap, glo, ghi = t_ci([r["gap_pts"] for r in rows])
    where = f"{args.workload} {args.size}" + (f" scale {args.scale}" if args.scale else "")
    seeds_note = "; ".join(f"seed {r['seed']}: fp32 {r['fp32']:.3f} PTQ {r['ptq']:.3f} QAT {r['qat']:.3f} "
                           f"fp32+ft {r['fp32_finetuned']:.3f}" for r in rows)
    # a share of a gap that is not there is noise divided by noise: only a gap whose CI is above 0 is recovered
    real_gap = not math.isnan(glo) and glo > 0
    if real_gap:
        rec_note = (f"mean over the {len(with_gap)} of {seeds} seeds where PTQ lost accuracy, Student-t 95 % CI "
                    f"over seeds (few seeds: wide); pooled over seeds {pooled:.0f} %; {seeds_note}")
    else:
        rec, lo, hi = float("nan"), float("nan"), float("nan")
        rec_note = (f"undefined: the PTQ gap's CI [{glo:.2f}, {ghi:.2f}] pts includes 0, PTQ lost nothing "
                    f"measurable here (per-seed ratios of a 1-2 sample gap would be noise); {seeds_note}")
    figs = [
        figure(f"{where} PTQ accuracy gap (fp32 - static int8)", gap, unit="pts", family="quantization",
               ci=(glo, ghi) if not math.isnan(glo) else None,
               note=f"{seeds} seeds, Student-t 95 % CI over seeds; {rows[0]['n_test']} test samples per seed"),
        figure(f"{where} QAT recovery of the PTQ gap", rec, unit="%", goal=">= 50 %", family="quantization",
               ci=(lo, hi) if not math.isnan(lo) else None, met=(rec >= 50) if real_gap else None, note=rec_note),
        figure(f"{where} QAT - fp32 fine-tuned the same way",
               t_ci([100 * (r["qat"] - r["fp32_finetuned"]) for r in rows])[0], unit="pts", family="quantization",
               note="the control: what fine-tuning alone (no fake-quant) does to the float model"),
    ]
    emit("qat_study", args, figs, seeds=rows,
         settings={"workload": args.workload, "size": args.size, "scale": args.scale, "seeds": seeds,
                   "calibration_batches": args.calibration_batches, "flow": "pt2e", "threads": 1,
                   "machine": "2 shared cores, busy with other sessions during the run"})


if __name__ == "__main__":
    main()
