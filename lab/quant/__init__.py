"""Int8 quantization: dynamic, static (calibrated) and quantization-aware training (:mod:`.int8`), through
torchao PT2E + X86InductorQuantizer compiled by Inductor (:mod:`.pt2e`, ``quant.flow='pt2e'``, the default; what
a pasted model needs to export and be annotated is :mod:`.export`) or
the legacy torch.ao path (``quant.flow='legacy'``), or whichever of the two is faster on the run's own model and
batch (``quant.flow='auto'``, :mod:`.flow_auto`); a swap guard that refuses a no-op (:mod:`.swap` for modules,
:mod:`.graph` for PT2E graphs); and float-vs-int8 measured the lab's way (:mod:`.report`, :mod:`.fair`: size,
interleaved latency against fp32 eager and fp32 compiled with CIs, compile time, accuracy delta against its
noise floor, output error, MACs beside the measured speedup, the training cost of QAT).

The family's technique (:class:`Quantization`, see :mod:`lab.technique`): ``check`` refuses what int8 here cannot
run (CUDA, fp16/bf16 autocast) before any work; ``after_training`` quantizes the trained model (QAT fine-tunes
through ``ctx.fit`` first) and records ``result.details["quant"]``. Notebook: ``notebooks/04_quantization.ipynb``."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from lab.config import QuantConfig, RunConfig
from lab.context import TrainContext
from lab.quant import export, fair, flow_auto, graph, int8, numerics, pt2e, storage, swap
from lab.quant import portable as portable_
from lab.quant import report as report_
from lab.quant.export import *  # noqa: F403 - the names in its __all__
from lab.quant.export import InductorFailed
from lab.quant.fair import *  # noqa: F403 - the names in its __all__
from lab.quant.flow_auto import *  # noqa: F403 - the names in its __all__
from lab.quant.graph import *  # noqa: F403 - the names in its __all__
from lab.quant.int8 import *  # noqa: F403 - the names in its __all__
from lab.quant.int8 import check_fx_traceable, check_some_flow_traces, check_supported, quantize_with_report
from lab.quant.numerics import *  # noqa: F403 - the names in its __all__
from lab.quant.pt2e import *  # noqa: F403 - the names in its __all__
from lab.quant.report import *  # noqa: F403 - the names in its __all__
from lab.quant.report import measure_against_float
from lab.quant.storage import *  # noqa: F403 - the names in its __all__
from lab.quant.swap import *  # noqa: F403 - the names in its __all__
from lab.quant.swap import check_model
from lab.quant.timed import int8_built, int8_share_note
from lab.registry import FAMILIES
from lab.result import RunResult
from lab.technique import Option, Portable, Technique
from lab.timed import INFER, Bench, NotTimed, TimedArm

__all__ = [*export.__all__, *fair.__all__, *flow_auto.__all__, *graph.__all__, *int8.__all__, *numerics.__all__,
           *pt2e.__all__, *report_.__all__, *storage.__all__, *swap.__all__, "Quantization", "TECHNIQUE"]


def _quantize_trained(ctx: TrainContext, model: nn.Module) -> nn.Module:
    """Quantize the trained model and record float-vs-int8 size, latency, accuracy and error."""
    qc = ctx.cfg.quant
    if not qc.enabled:
        return model
    qat_stats: dict[str, Any] = {}

    def finetune(prepared: nn.Module) -> None:
        stats = ctx.fit(prepared.to(ctx.device), epochs=qc.qat_epochs, lr=ctx.resolved.lr * qc.qat_lr_factor,
                        phase="qat")
        qat_stats.update(steps=stats.steps, time_s=stats.time_s, step_ms=stats.step_times_ms["total"])

    def quantize(qc_: QuantConfig) -> tuple[nn.Module, dict[str, Any]]:
        return quantize_with_report(model, qc_, ctx.make_loader(), finetune=finetune if qc.method == "qat" else None,
                                    example_inputs=tuple(t[:2] for t in ctx.data.train[:-1]))

    if qc.flow == "auto":  # both flows, timed on the run's own inference batch (lab.quant.flow_auto)
        n = min(ctx.cfg.eval_batch_size, len(ctx.data.test[0]))
        q, info = flow_auto.probe_flows(model, qc, quantize, tuple(t[:n] for t in ctx.data.test[:-1]),
                                        repeats=ctx.cfg.latency_repeats)
        ctx.result.why.append(f"quant.flow='auto' took {info['flow']}: {info['auto']['why']}")
    else:
        q, info = quantize(qc)
    try:
        _measure(ctx, model, q, info, qat_stats)
    except InductorFailed as exc:  # a batch size Inductor could not compile: the legacy flow takes the model
        if info.get("flow") != "pt2e":
            raise
        q, info = quantize(dataclasses.replace(qc, flow="legacy"))
        info.update(flow_asked=qc.flow, flow_fallback=f"{exc}; the legacy torch.ao flow took it")
        _measure(ctx, model, q, info, qat_stats)
    ctx.result.details["quant"] = info
    return q


def _measure(ctx: TrainContext, model: nn.Module, q: nn.Module, info: dict[str, Any],
             qat_stats: dict[str, Any]) -> None:
    info["backend_engine"] = (torch.backends.quantized.engine if info.get("flow") == "legacy"
                              else "x86 (Inductor + oneDNN)")
    info["isa_flags"] = ctx.result.env.get("isa_flags", [])
    info["cpu"] = ctx.result.env.get("cpu_model")
    info["cpu_capability"] = ctx.result.env.get("cpu_capability")
    measure_against_float(ctx, model, q, info, qat_stats)


class Quantization(Technique):
    """Int8 of the trained model (QAT fine-tunes with fake-quant first), measured against its float model."""

    name = "quant"

    def timed(self, option: Option, bench: Bench, arm: TimedArm) -> None:
        """The arm calls the int8 model of its model (built once per rung, :func:`lab.quant.timed.int8_built`),
        with the share of MACs that runs in int8 as its note. Inference only: int8 after training does not touch
        the training step; ``auto`` flows and QAT are not a conversion of the arm's model."""
        method = option.overrides.get("quant.method", "none")
        flow = option.overrides.get("quant.flow", QuantConfig().flow)
        if arm.axis != INFER:
            raise NotTimed(f"{option.name} quantizes the trained model: it changes inference, not the training step")
        if method not in ("dynamic", "static") or flow == "auto":
            raise NotTimed(f"{option.name} is not one conversion of the arm's model (QAT trains; auto chooses)")
        pruned = arm.model.eval() if arm.derived else None
        model_q, info = int8_built(bench, method, flow, pruned=pruned, derived=arm.derived)
        arm.notes.append(int8_share_note(bench, model_q, info))
        arm.derive(model_q, "int8")

    def check(self, cfg: RunConfig) -> None:
        """Refuse int8 combinations this machine cannot run, before any training (torchao missing for the
        default PT2E flow included: one line, and the way out)."""
        if cfg.quant.enabled:
            check_supported(cfg)
            if cfg.quant.flow == "auto" and cfg.quant.method == "qat":
                raise ValueError(flow_auto.WHY_NO_QAT)
            if cfg.quant.flow == "pt2e":
                pt2e.check_available()
                pt2e.check_pt2e_config(cfg.quant)

    def preflight(self, ctx: TrainContext, model: nn.Module) -> None:
        """Before any training: the method must be able to replace something in this model (saying why per
        layer), and static int8 cannot calibrate on more batches than the training split holds. Nothing happens
        before training: QAT here trains float first, then fine-tunes with fake-quant after it (fake-quant from
        step 0 slows every step and learns ranges of a network that is still changing)."""
        qc = ctx.cfg.quant
        if not qc.enabled:
            return
        check_model(model, qc.method)
        if qc.flow == "legacy" and qc.method in ("static", "qat"):  # auto: legacy is then not a candidate
            check_fx_traceable(model, qc.method)
        if qc.flow == "pt2e" and qc.method in ("static", "qat"):
            check_some_flow_traces(model, qc.method, tuple(t[:2].to(ctx.device) for t in ctx.data.train[:-1]))
        if qc.method == "static":
            available = ctx.steps_per_epoch()
            # the default (16) adapts to a small split; a number asked for must be there
            if qc.calibration_batches > available and qc.calibration_batches != QuantConfig().calibration_batches:
                raise ValueError(f"quant.calibration_batches={qc.calibration_batches} is invalid: the training "
                                 f"split has {available} batches of {ctx.resolved.batch_size}; lower it (or the "
                                 "batch size)")

    def after_training(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        return _quantize_trained(ctx, model)

    def replaces_model(self, cfg: RunConfig) -> bool:
        return cfg.quant.enabled

    def portable(self, cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
        """``for_inference`` through the config's flow (QAT's fake-quant fine-tune too), written out; ``auto`` as
        the flow a stored run took (:mod:`lab.quant.portable`)."""
        return portable_.portable(cfg, run)

    def report(self, result: RunResult) -> dict[str, Any]:
        """Method, size ratio and the batch-N inference speedup against the float model: for a compiled int8
        model against fp32 compiled the same way (rule 13; the eager ratio beside it), with the "not an int8
        speedup" line when too few MACs run int8."""
        rec = result.details.get("quant", {})
        lat = rec.get("latency") or {}
        big = max(lat, key=lambda k: int(k.split("_")[-1]), default=None)
        row = lat[big] if big else {}
        fair_row = row.get("vs_fp32_compiled") or row
        return {"method": rec.get("method", "none"), "size_ratio": rec.get("size_ratio"),
                "inference_speedup": fair_row.get("ratio"),
                "inference_speedup_against": "fp32 compiled" if "vs_fp32_compiled" in row else "fp32 eager",
                "inference_speedup_vs_fp32_eager": row.get("ratio"),
                "credit": fair.compilation_credit(rec),
                "kept_float": (rec.get("swap") or {}).get("kept_float", [])}


TECHNIQUE = FAMILIES.register(Quantization.name, Quantization(), overwrite=True)  # overwrite: reload idempotent
from lab.quant import options  # noqa: E402, F401 - the family's option strings, registered with it
