"""QAT recovery study: where post-training int8 (PTQ) loses accuracy, how much of that gap QAT wins back, over
seeds, with a CI, against the control of fine-tuning the float model the same way.

    python benchmarks/qat_study.py [--quick] [--json PATH] [--cases vision:tiny:xs,mlp:tiny,...]
                                   [--configs pt2e,legacy_minmax_tensor] [--seeds 3] [--calibration-batches N]

Per case (workload:size[:model scale]) and seed: one float model trained exactly as ``lab run`` does
(:func:`lab.quant.trained_float_model`), then, per PTQ configuration (:data:`CONFIGS`), static int8 calibrated on
the training loader and QAT (fake-quant fine-tune of ``qat_epochs`` at lr x ``qat_lr_factor``, the lab's defaults)
with the same flow and weight granularity; once per seed, the control QAT must beat: the float model fine-tuned
the same way without fake-quant. Accuracy is read on the held-out test split from the converted int8 graphs run
eagerly (they compute what the compiled ones compute; compiling would only add minutes).

Why several configurations: the lab's default (PT2E, histogram observer, per-channel weights, 8-bit activations
where the CPU has VNNI) is the gentlest PTQ there is; min/max calibration with one weight scale per tensor (the
legacy flow's knobs) is the classic one that loses on wide activation ranges; ``pt2e_7bit`` is what an AVX2-only
CPU gets (7-bit activations, :class:`lab.config.QuantConfig` ``reduce_range``). A study on the gentle one alone
could only ever say "nothing to recover".

Per case and configuration: gap = fp32 - PTQ with a Student-t 95 % CI over seeds; only where that CI is above 0
and the gap is at least ``MIN_RECOVERABLE_GAP_PTS`` (the lab's own "no loss" tolerance) is a recovery share computed,
(QAT - PTQ) / gap, mean over seeds with its CI and the pooled ratio beside it (a share of a gap that is not
there is noise divided by noise); and always QAT - (fp32 fine-tuned the same way), the part of QAT's gain that
fine-tuning alone does not give. Goal (issue 6 / 30): QAT recovers >= 50 % of a real
PTQ gap.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from typing import Any

import torch
from _common import emit, figure
from torch import nn

from lab import RunConfig
from lab.config import QuantConfig
from lab.context import thread_count
from lab.measure import mean_t_ci
from lab.quant import (
    MIN_RECOVERABLE_GAP_PTS,
    converted_graph,
    outputs_of,
    qat_recovery,
    quantize_with_report,
    trained_float_model,
)

#: PTQ configurations: name -> QuantConfig fields. QAT of a configuration keeps its flow, weight granularity
#: and activation bits (QAT always observes with moving-average fake-quant, so ``observer`` is PTQ's alone).
CONFIGS: dict[str, dict[str, Any]] = {
    "pt2e": {},
    "pt2e_7bit": {"reduce_range": "on"},
    "legacy_minmax_tensor": {"flow": "legacy", "observer": "minmax", "per_channel": False},
}
QAT_FIELDS = ("flow", "per_channel", "reduce_range")
DEFAULT_CASES = "vision:tiny:xs,mlp:tiny,transformer:tiny,ctr:tiny"
QUICK_CASES = "vision:tiny:xs,mlp:tiny"


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"2 seeds, cases {QUICK_CASES}")
    p.add_argument("--json", metavar="PATH", help="write the figures here")
    p.add_argument("--cases", default=None, help=f"workload:size[:scale],... (default {DEFAULT_CASES})")
    p.add_argument("--configs", default="pt2e,legacy_minmax_tensor",
                   help=f"PTQ configurations, comma-separated, of: {', '.join(CONFIGS)}")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--calibration-batches", type=int, default=QuantConfig().calibration_batches)
    args = p.parse_args()
    args.cases = [_case(c) for c in (args.cases or (QUICK_CASES if args.quick else DEFAULT_CASES)).split(",")]
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad or not args.configs:
        p.error(f"--configs {bad or '(empty)'}: allowed: {', '.join(CONFIGS)}")
    if args.seeds < 2:
        p.error(f"--seeds {args.seeds}: need at least 2 (a CI over seeds needs two)")
    return args


def _case(text: str) -> tuple[str, str, str | None]:
    parts = [p.strip() for p in text.split(":")]
    if not 2 <= len(parts) <= 3 or not all(parts):
        raise SystemExit(f"--cases: {text!r} is not workload:size[:scale]")
    return parts[0], parts[1], (parts[2] if len(parts) == 3 else None)


def _metric(ctx: Any, model: nn.Module) -> float:
    wl, test = ctx.workload, ctx.data.test
    return float(wl.evaluate(outputs_of(model, test[:-1]), test[-1])[wl.metric_name])


def _int8_metric(ctx: Any, qmodel: nn.Module, flow: str) -> float:
    # a PT2E result is a compiled wrapper: its converted graph computes the same thing, eagerly
    return _metric(ctx, converted_graph(qmodel) if flow == "pt2e" else qmodel)


def one_seed(case: tuple[str, str, str | None], seed: int, configs: list[str],
             calibration_batches: int) -> dict[str, Any]:
    """fp32, the fine-tuned control, and per configuration PTQ and QAT, all on one trained float model."""
    workload, size, scale = case
    cfg = RunConfig(workload=workload, size=size, model_scale=scale, seed=seed, threads=1, device="cpu")
    t0 = time.perf_counter()
    model, ctx = trained_float_model(cfg)
    example = tuple(t[:2] for t in ctx.data.train[:-1])
    base = QuantConfig()
    lr = ctx.resolved.lr * base.qat_lr_factor
    row: dict[str, Any] = {"seed": seed, "fp32": _metric(ctx, model), "n_test": len(ctx.data.test[-1])}

    def finetune(m: nn.Module) -> None:
        ctx.fit(m, epochs=base.qat_epochs, lr=lr, phase="qat")

    with thread_count(1):
        ft = copy.deepcopy(model).train()
        ctx.fit(ft, epochs=base.qat_epochs, lr=lr, phase="finetune")
        row["fp32_finetuned"] = _metric(ctx, ft.eval())
        for name in configs:
            fields = CONFIGS[name]
            flow = fields.get("flow", base.flow)
            ptq, _ = quantize_with_report(model, QuantConfig(method="static", calibration_batches=calibration_batches,
                                                             **fields), ctx.make_loader(), example_inputs=example)
            qat_fields = {k: v for k, v in fields.items() if k in QAT_FIELDS}
            qat, _ = quantize_with_report(model, QuantConfig(method="qat", qat_epochs=base.qat_epochs, **qat_fields),
                                          ctx.make_loader(), finetune=finetune, example_inputs=example)
            row[name] = {"ptq": _int8_metric(ctx, ptq, flow), "qat": _int8_metric(ctx, qat, flow)}
    row["seconds"] = time.perf_counter() - t0
    cells = "; ".join(f"{n}: PTQ {row[n]['ptq']:.4f} QAT {row[n]['qat']:.4f}" for n in configs)
    print(f"{_where(case)} seed {seed}: fp32 {row['fp32']:.4f} fp32+ft {row['fp32_finetuned']:.4f}; {cells} "
          f"({row['seconds']:.0f} s)", flush=True)
    return row


def _where(case: tuple[str, str, str | None]) -> str:
    workload, size, scale = case
    return f"{workload} {size}" + (f" scale {scale}" if scale else "")


def _ci(lo: float, hi: float) -> tuple[float, float] | None:
    return None if math.isnan(lo) else (lo, hi)


def case_figures(case: tuple[str, str, str | None], rows: list[dict[str, Any]], config: str) -> list[dict[str, Any]]:
    """Three figures for one case under one PTQ configuration: the gap, QAT's share of it, QAT beyond fine-tuning."""
    where, seeds = f"{_where(case)} {config}", len(rows)
    rec = qat_recovery([r["fp32"] for r in rows], [r[config]["ptq"] for r in rows], [r[config]["qat"] for r in rows])
    glo, ghi = rec["gap_ci"]
    per_seed = "; ".join(f"seed {r['seed']}: fp32 {r['fp32']:.3f} PTQ {r[config]['ptq']:.3f} "
                         f"QAT {r[config]['qat']:.3f} fp32+ft {r['fp32_finetuned']:.3f}" for r in rows)
    if rec["real_gap"]:
        note = (f"mean over the {rec['n_with_gap']} of {seeds} seeds where PTQ lost accuracy, Student-t 95 % CI over "
                f"seeds (few seeds: wide); pooled over seeds {rec['pooled']:.0f} %; {per_seed}")
    elif not math.isnan(glo) and glo > 0:
        note = (f"undefined: the PTQ gap {rec['gap']:.2f} pts [{glo:.2f}, {ghi:.2f}] is real but below "
                f"{MIN_RECOVERABLE_GAP_PTS} pt, no loss by the lab's tolerance; {per_seed}")
    else:
        note = (f"undefined: the PTQ gap's CI [{glo:.2f}, {ghi:.2f}] pts includes 0, PTQ lost nothing measurable "
                f"here; {per_seed}")
    beyond, blo, bhi = mean_t_ci([100 * (r[config]["qat"] - r["fp32_finetuned"]) for r in rows])
    return [
        figure(f"{where} PTQ accuracy gap (fp32 - static int8)", rec["gap"], unit="pts", family="quantization",
               ci=_ci(glo, ghi), note=f"{seeds} seeds, Student-t 95 % CI over seeds; {rows[0]['n_test']} test "
                                       "samples per seed"),
        figure(f"{where} QAT recovery of the PTQ gap", rec["share"], unit="%", goal=">= 50 %", family="quantization",
               ci=_ci(*rec["share_ci"]), met=(rec["share"] >= 50) if rec["real_gap"] else None, note=note),
        figure(f"{where} QAT - fp32 fine-tuned the same way", beyond, unit="pts", family="quantization",
               ci=_ci(blo, bhi), note="the control: QAT's gain that the same fine-tuning without fake-quant does "
                                      "not give (a CI around 0: QAT's gain over PTQ is the extra epoch)"),
    ]


def main() -> None:
    args = _args()
    seeds = 2 if args.quick else args.seeds
    torch.set_num_threads(1)
    by_case = {_where(c): [one_seed(c, s, args.configs, args.calibration_batches) for s in range(seeds)]
               for c in args.cases}
    figs = [f for c in args.cases for config in args.configs for f in case_figures(c, by_case[_where(c)], config)]
    real = [f for f in figs if "QAT recovery" in f["name"] and f["met"] is not None]
    gaps = [f for f in figs if "PTQ accuracy gap" in f["name"]]
    figs.append(figure("PTQ configurations with a real accuracy gap", len(real), unit="of " + str(len(gaps)),
                       family="quantization",
                       note=f"cases x configurations whose fp32 - PTQ CI over seeds is above 0 and whose gap is at "
                            f"least {MIN_RECOVERABLE_GAP_PTS} pt; only those have a recovery share"
                            + (": " + ", ".join(f["name"].replace(" QAT recovery of the PTQ gap", "") for f in real)
                               if real else "")))
    emit("qat_study", args, figs, seeds={k: v for k, v in by_case.items()},
         settings={"cases": [_where(c) for c in args.cases], "configs": {c: CONFIGS[c] for c in args.configs},
                   "seeds": seeds, "calibration_batches": args.calibration_batches, "threads": 1})


if __name__ == "__main__":
    main()
