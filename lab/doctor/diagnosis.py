"""``diagnose(cfg)``: a short profiled baseline, this machine's rates, and a ranked prescription.

Why a real run and not a static look at the model: the op mix of a step depends on the batch, the loader,
the thread count and the machine (the same DLRM is embedding-bound at batch 128 and matmul-bound at 8192),
so the doctor measures the user's own step, through the same :func:`lab.run` every ablation uses, with
``profile=True`` (:func:`lab.profiling.profile_run`). Then every technique in :data:`lab.registry.OPTIONS`
that the capability gate and the config checks allow gets a prediction (:mod:`lab.doctor.predict`); the
others are listed with the reason they were left out. Taught in ``notebooks/08_doctor.ipynb``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lab.config import QuantConfig, RunConfig, load_workload
from lab.context import prepare, resolve, resolve_device
from lab.doctor import model_rates
from lab.doctor import rates as rates_
from lab.doctor.calibration import Calibration, calibrated, load_calibration
from lab.doctor.compile_rate import activation_shape, compile_cost
from lab.doctor.data_parallel import predict_data_parallel
from lab.doctor.predict import Prediction, Rates, larger_batch_advice, predict_technique
from lab.doctor.predict_compile import attention_modules
from lab.doctor.risk import NOTHING_PAYS, RULE, RunLength, prescribe, prescription
from lab.loop import to_device
from lab.measure import limit_sentence, limit_sentences, load_card
from lab.measure.profile import OP_CLASSES, Breakdown
from lab.memory import no_blocks_refusal
from lab.memory.checkpointing import checkpointed_copy
from lab.precision import capability, model_gate
from lab.registry import OPTIONS
from lab.result import RunResult
from lab.result.failure import failed
from lab.technique import Option
from lab.train import check, run

#: What ``diagnose(measure=...)`` can time on the model itself when the user accepts the cost.
MEASURABLE = ("compile",)
#: Why nothing is prescribed when the profiled baseline ran on a busy machine: the step it profiled carries
#: other processes' time, and the intervals are calibrated on quiet verifications only
#: (:data:`lab.doctor.calibration.QUIET_AA`), so a prescription would rank the load, not the techniques.
BUSY_REFUSAL = "the profiled baseline ran while this machine was busy: rerun the doctor when it is idle"

#: ``stage(name, message)``: where a diagnosis stands, said as each stage starts (``"calibrate"``, "bf16 and fp16
#: GEMMs at this model's shapes"; ``"predict"``, "bf16 (3/9)"), so a background job can show it
#: (:mod:`lab.doctor.jobs`).
StageFn = Callable[[str, str], None]


def _quiet(name: str, message: str) -> None:
    """No one listens to the stages (the CLI, a notebook)."""


@dataclass
class Diagnosis:
    """What the doctor found: the profiled baseline, its breakdowns, the rates used, the ranked predictions."""

    cfg: RunConfig
    baseline: RunResult
    train: Breakdown
    infer: Breakdown | None
    rates: Rates
    rate_source: str
    predictions: list[Prediction]
    skipped: dict[str, str] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    calibration_s: float = 0.0
    data_parallel: Prediction | None = None  # advice, not ranked (:func:`data_parallel_advice`)
    noise: float = 0.0  # the verifications' A/A noise, a log half-width (no prescription is finer)
    run: RunLength | None = None  # the run the ranking is for (:meth:`for_run`)
    busy: str = ""  # the profiled baseline's contention warning (lab.measure.contention): set, nothing is prescribed

    @property
    def hardware_id(self) -> str:
        return self.baseline.hardware_id

    def top(self, axis: str = "train_step") -> Prediction | None:
        """The prescribed pick on ``axis`` (``None``: nothing there pays beyond noise, :data:`NOTHING_PAYS`)."""
        return prescription(self.predictions, axis)

    def for_run(self, steps: int, what: str = "the full run") -> Diagnosis:
        """The same diagnosis ranked for a run of ``steps`` steps at the baseline's step (:func:`prescribe`: each
        pick's one-off costs over that length, prescribed only beyond the A/A noise)."""
        run = RunLength(steps=max(1, int(steps)), step_ms=self.train.step_ms, what=what)
        ranked = prescribe(self.predictions, run, overrides={n: o.overrides for n, o in OPTIONS.items()},
                           rates=self.rates, breakdown=self.train, noise=self.noise)
        if self.busy:  # the bands are quiet verifications' errors: a busy baseline's step is outside them
            ranked = [dataclasses.replace(p, prescribed=False, reason=f"{p.reason}; not prescribed: {BUSY_REFUSAL}")
                      for p in ranked]
        return dataclasses.replace(self, predictions=ranked, run=run)

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.cfg.workload, "size": self.cfg.size, "hardware_id": self.hardware_id,
                "config": self.cfg.to_dict(),  # what a stored diagnosis is verified against (lab.doctor.jobs)
                "baseline_run_id": self.baseline.run_id, "train": self.train.to_dict(),
                "inference": self.infer.to_dict() if self.infer else None, "rate_source": self.rate_source,
                "predictions": [p.to_dict() for p in self.predictions], "skipped": dict(self.skipped),
                "advice": list(self.advice), "calibration_s": self.calibration_s, "noise": self.noise,
                "busy": self.busy,
                "run": dataclasses.asdict(self.run) if self.run else None,
                "prescription": {a: (p.technique if (p := self.top(a)) else None)
                                 for a in ("train_step", "inference")},
                "data_parallel": self.data_parallel.to_dict() if self.data_parallel else None}


def gate(tech: Option, cfg: RunConfig) -> str | None:
    """Why ``tech`` cannot be tried on ``cfg`` here (``None`` when it can): a config or machine check refuses
    it, the capability gate calls its precision emulated, or the baseline already uses it."""
    try:
        arm = cfg.with_overrides(**tech.overrides)
        check(arm)
    except ValueError as exc:
        return str(exc).split(";")[0]
    if arm == cfg:
        return "already in the baseline"
    dtype = tech.overrides.get("precision.dtype")
    if dtype in ("bf16", "fp16"):
        cap = capability(dtype, resolve_device(cfg.device).type)
        if not cap.native:
            return f"capability gate: {cap.why_tag()} ({cap.reason}: slower, not predicted)"
        r = resolve(arm)  # the run's own model gate (fp16 convolutions on CPU): neither prescribed nor verified
        refused = model_gate(r.workload.make_model(r.spec), dtype, r.device.type, arm.precision.fp32_modules)
        if refused:
            return f"does not apply here: {refused}"
    if tech.overrides.get("memory.checkpoint") == "blocks":  # the run's own preflight refusal, before profiling
        r = resolve(arm)
        model = r.workload.make_model(r.spec)
        if not r.workload.model_blocks(model):
            return f"does not apply here: {no_blocks_refusal(arm.workload, model)}"
    return None


def calibrate(cfg: RunConfig, techniques: Sequence[Option], measure: Sequence[str] = (),
              stage: StageFn | None = None) -> Rates:
    """The on-the-spot rates the allowed ``techniques`` need, at this model's shapes and the run's threads;
    ``measure``: the whole-model measurements the user pays for (``"compile"``: this model compiled). ``stage``
    hears each measurement as it starts (``("calibrate", what)``)."""
    wanted = {k: v for t in techniques for k, v in t.overrides.items()}
    out = Rates()
    say = (lambda what: stage("calibrate", what)) if stage is not None else (lambda what: None)
    with prepare(cfg) as ctx:
        say("building the model and one batch")
        model = ctx.new_model()
        batch = to_device(tuple(next(iter(ctx.make_loader()))), ctx.device)
        inputs = tuple(batch[:-1])
        out.batch_bytes = int(sum(t.numel() * t.element_size() for t in batch))
        shapes = rates_.dominant_layers(model, inputs)
        out.attention = attention_modules(model)
        dtypes = sorted({t.overrides["precision.dtype"] for t in techniques
                         if t.overrides.get("precision.dtype") in ("bf16", "fp16")})
        if dtypes:
            say(f"{' and '.join(dtypes)} GEMMs at this model's shapes, then its forward + backward")
            out.precision = rates_.precision_rates(shapes, dtypes)
            out.model_precision = model_rates.model_precision_rates(
                model, inputs, batch[-1], ctx.workload.loss, dtypes, device_type=ctx.device.type,
                fp32_modules=cfg.precision.fp32_modules)
        if "fp16" in dtypes:
            say("fp16's gradient scaler")
            out.grad_scaler = rates_.grad_scaler_rate(model, cfg.optimizer, ctx.resolved.lr)
        if wanted.get("compute.fused_optimizer"):
            say("the fused optimizer step")
            out.fused_optimizer = rates_.optimizer_rate(model, cfg.optimizer, ctx.resolved.lr)
        if "quant.method" in wanted:
            rows = min(cfg.eval_batch_size, len(ctx.data.test[0]))
            say("dynamic int8 matmuls")
            out.dynamic_int8 = rates_.dynamic_int8_rate(shapes, rows)
        if wanted.get("compute.compile") and "compile" in measure:
            say("this model compiled (seconds to a minute)")
            try:
                out.model_compile, out.model_compile_s = model_rates.model_compile_rate(
                    model, inputs, batch[-1], ctx.workload.loss)
            except Exception:  # noqa: BLE001 - the model does not compile here: the chain / map / prior say so
                out.model_compile = None
        if wanted.get("compute.compile") and out.model_compile is None:
            say("what compile saves per op and costs per call")
            try:
                out.compile = compile_cost(activation_shape(shapes.linear, len(batch[0])))
            except Exception:  # noqa: BLE001 - no compiler here: the prediction falls back to its prior and says so
                out.compile = None
        if wanted.get("compute.fast_kernels") and ctx.workload.fast_kernels is not None:
            say("the workload's fast kernels")
            fast = ctx.workload.fast_kernels(copy.deepcopy(model))
            out.fast_kernels = rates_.model_fwd_bwd_rate(model, fast, inputs, "the workload's fast kernels vs its "
                                                         "default forward + backward on one batch")
        if wanted.get("memory.checkpoint") == "blocks" and ctx.workload.model_blocks(model):
            say("the model with its blocks checkpointed")
            twin, names = checkpointed_copy(model, ctx.workload.model_blocks)
            out.checkpoint = rates_.model_fwd_bwd_rate(model, twin, inputs, f"this model's forward + backward, "
                                                       f"plain vs its {len(names)} blocks checkpointed, one batch")
        for t in techniques:
            loader = t.overrides.get("data.loader")
            data = {k: v for k, v in t.overrides.items() if k.startswith("data.")}
            readers = int(data.get("data.prefetch_readers", 1))
            if loader in ("thread", "dataloader"):
                say(f"the {t.name} loader beside this model's step")
            if loader == "thread" and readers == 1:
                out.thread_loader_ms = _loader_ms(cfg, data, model, inputs, batch[-1], ctx.workload.loss,
                                                  "a batch through the thread prefetcher")
            elif loader == "thread":  # each reader count its own measurement: prefetch and parallel_reads differ
                out.thread_readers_ms[readers] = _loader_ms(
                    cfg, data, model, inputs, batch[-1], ctx.workload.loss,
                    f"a batch through the thread prefetcher with {readers} reads in flight")
            elif loader == "dataloader" and int(data.get("data.num_workers", 0)) > 0:
                n = int(data["data.num_workers"])
                out.worker_loader_ms[n] = _loader_ms(cfg, data, model, inputs, batch[-1], ctx.workload.loss,
                                                     f"a batch from a DataLoader with {n} worker processes")
        say("the fixed cost of one small op")
        with torch.no_grad():
            out.tiny_op_us = rates_.tiny_op_us()
    return out


def _loader_ms(cfg: RunConfig, data: dict[str, Any], model: torch.nn.Module, inputs: tuple, target: torch.Tensor,
               loss_fn: Any, what: str) -> rates_.Rate | None:
    """A loader technique's extra ms per batch beside this model's forward + backward, through the loader
    the technique's own run would build (its config, its data). ``None`` when that loader cannot run here
    (the prediction then falls back to its priors and says so)."""
    try:
        with prepare(cfg.with_overrides(**data)) as actx:
            return model_rates.loader_extra_ms(model, inputs, target, loss_fn, actx.make_loader(),
                                               f"{what} beside this model's forward + backward, vs the "
                                               "forward + backward alone")
    except Exception:  # noqa: BLE001 - e.g. no worker processes allowed here: priors, said in the reason
        return None


def _crossover_rates(cmap: rates_.CrossoverMap, techniques: Sequence[Option], macs: float,
                     workload: str, batches: dict[str, int]) -> dict[tuple[str, str], rates_.Rate]:
    """The map's rate of each technique on each axis, at this model's MACs and at the batch each axis runs at
    (``batches``: axis -> the training batch, the eval batch)."""
    found = {}
    for t in techniques:
        for axis in rates_.CROSSOVER_AXES:
            rate = cmap.rate(t.name, axis, macs, workload, batches.get(axis))
            if rate is not None:
                found[(t.name, axis)] = rate
    return found


def diagnose(cfg: RunConfig, *, techniques: Sequence[str] | None = None, crossover_root: Path | None = None,
             progress: Any = None, calibration: Calibration | None = None, measure: Sequence[str] = (),
             stage: StageFn | None = None) -> Diagnosis:
    """Profile ``cfg`` once (``profile=True``), gather this machine's rates (the crossover map of its hardware
    id when there is one, else micro-benchmarks) and predict every allowed technique, ranked, each interval
    widened to the doctor's own error (``calibration``; default: :func:`load_calibration` of this machine).
    ``measure=("compile",)``: time this model compiled too (seconds to a minute), which then wins over the map.
    ``progress`` gets the profiled run's step events; ``stage`` hears each stage as it starts (``"profile"``,
    ``"calibrate"`` with what it measures, ``"predict"`` with the technique and its number)."""
    stage = stage or _quiet
    cfg = load_workload(cfg)  # a workload spec imported once, before the profiled run (and named by its name)
    bad = [m for m in measure if m not in MEASURABLE]
    if bad:
        raise ValueError(f"measure={bad} is invalid: allowed: {', '.join(MEASURABLE)}")
    names = list(OPTIONS) if techniques is None else list(techniques)
    unknown = [n for n in names if n not in OPTIONS]
    if unknown:
        raise ValueError(f"techniques={unknown} are unknown: allowed: {', '.join(OPTIONS)}")
    base = dataclasses.replace(cfg, profile=True)
    skipped: dict[str, str] = {}
    allowed = []
    for n in names:
        why = gate(OPTIONS[n], cfg)
        if why:
            skipped[n] = why
        else:
            allowed.append(OPTIONS[n])
    stage("profile", "the baseline")
    result = run(base, progress=progress, on_error="record")
    if failed(result.status):
        raise ValueError(f"the profiled baseline failed: {result.error}")
    prof = result.details.get("profile", {})
    if "train" not in prof:
        raise ValueError(f"the baseline was not profiled: {prof.get('note', 'no profile recorded')}")
    train = Breakdown.from_dict(prof["train"])
    infer = Breakdown.from_dict(prof["inference"]) if prof.get("inference") else None
    t0 = time.perf_counter()
    cmap = rates_.find_crossover(result.hardware_id, crossover_root)
    batches = {"train_step": result.batch_size or None,
               "inference": (prof.get("inference") or {}).get("batch") or cfg.eval_batch_size}
    mapped = cmap is not None and cmap.rate("compile", "train_step", result.macs_per_sample, cfg.workload,
                                            batches["train_step"])
    # the map's compile rate wins (as every map rate does), so the chain's two compiles are not paid for nothing
    # ... unless the user pays for the model's own compiled forward + backward, which wins over the map
    r = calibrate(cfg, [t for t in allowed if "compile" in measure
                        or not (mapped and t.overrides.get("compute.compile"))], measure, stage)
    r.steps = result.steps
    r.macs_per_sample = float(result.macs_per_sample or 0.0)
    if cmap is not None:
        r.crossover = _crossover_rates(cmap, allowed, result.macs_per_sample, cfg.workload, batches)
        source = f"crossover map {cmap.path} ({len(r.crossover)} technique rates) + on-the-spot micro-benchmarks"
    else:
        source = (f"no crossover map for {result.hardware_id}: micro-benchmarks on the spot at this model's shapes "
                  f"and the model's own forward + backward instead; {rates_.crossover_advice(crossover_root)}")
    calib_s = time.perf_counter() - t0
    preds: list[Prediction] = []
    precision = [t for t in allowed if t.overrides.get("precision.dtype") in ("bf16", "fp16")]
    prec_preds = [p for t in precision if (p := predict_technique(t.name, t.overrides, t.axes, train, infer, r))]
    for i, t in enumerate(allowed, 1):
        stage("predict", f"{t.name} ({i}/{len(allowed)})")
        p = predict_technique(t.name, t.overrides, t.axes, train, infer, r, prec_preds)
        if p is None:
            skipped[t.name] = "no prediction model for what it changes"
        else:
            preds.append(p)
    advice = [larger_batch_advice(train)[1], cite_machine_card(preds, skipped, allowed, result.hardware_id)]
    ddp = data_parallel_advice(cfg, result, train)
    advice.append(ddp.reason if ddp is not None else "data-parallel not predicted: no all-reduce link calibrated "
                  f"for {result.hardware_id} (python benchmarks/distributed.py calibrates one)")
    cal = calibration if calibration is not None else load_calibration(result.hardware_id)
    d = Diagnosis(cfg=cfg, baseline=result, train=train, infer=infer, rates=r, rate_source=source,
                  predictions=calibrated(preds, cal), skipped=skipped, advice=advice, calibration_s=calib_s,
                  data_parallel=ddp, noise=cal.noise_floor(),
                  busy=(result.details.get("contention") or {}).get("sentence") or "")
    return d.for_run(result.steps or 1, "this run")


def _card_dtype(overrides: dict[str, Any]) -> str | None:
    """The GEMM dtype of the machine card that bounds a technique (bf16, fp16, int8), if any."""
    dtype = overrides.get("precision.dtype")
    if dtype in ("bf16", "fp16"):
        return dtype
    return "int8" if overrides.get("quant.method") in QuantConfig.INT8_METHODS else None


def cite_machine_card(preds: list[Prediction], skipped: dict[str, str], techniques: Sequence[Option],
                      hardware_id: str) -> str:
    """Set each bf16 / fp16 / int8 prediction and refusal against this machine's card (``lab machine``): the
    GEMM peak ratio is the most that technique can give a GEMM-bound step here. Returns the advice line."""
    card = load_card()
    if card is None:
        return (f"no machine card for {hardware_id}: `python -m lab machine` measures its GEMM peaks (about 30 s), "
                "and the prescription then cites them")
    dtypes = {t.name: d for t in techniques if (d := _card_dtype(t.overrides))}
    for name, why in list(skipped.items()):
        dtype = _card_dtype(OPTIONS[name].overrides) if name in OPTIONS else None
        limit = limit_sentence(card, dtype) if dtype else None
        if limit and why.startswith("capability gate"):
            skipped[name] = f"{why}; card: {limit}"
    for i, p in enumerate(preds):
        limit = limit_sentence(card, dtypes[p.technique]) if p.technique in dtypes else None
        if limit:
            preds[i] = dataclasses.replace(p, reason=f"{p.reason}; card: {limit}")
    return f"machine card ({card.hardware_id}): " + "; ".join(limit_sentences(card))


def data_parallel_advice(cfg: RunConfig, result: RunResult, train: Breakdown) -> Prediction | None:
    """Data-parallel as advice (:func:`lab.doctor.data_parallel.predict_data_parallel`): from the profiled comm class
    of a DDP baseline, else 2 ranks from this machine's calibrated all-reduce link and the model's gradient
    bytes. Not a ranked prescription: its ranks train a W times larger effective batch, so it competes on
    samples per second, not on the per-step time the verification measures."""
    if cfg.ddp.world_size > 1:
        return predict_data_parallel(train, cfg.ddp.world_size, measured=True)
    threads = int(result.env.get("torch_threads") or cfg.threads or 1)
    cores = os.cpu_count() or 1
    return predict_data_parallel(train, 2, grad_bytes=4.0 * (result.param_count or 0),
                                 link=rates_.find_link(result.hardware_id),
                                 bucket_bytes=cfg.ddp.bucket_cap_mb * 2**20, core_share=2 * threads / cores)


def format_breakdown(b: Breakdown, title: str) -> str:
    rows = [f"{title}: {b.step_ms:.3g} ms" + (f" (under the profiler {b.profiled_step_ms:.3g} ms)"
                                              if b.profiled_step_ms else "")]
    for c in OP_CLASSES:
        if b.ms.get(c, 0.0) > 0:
            tiny = b.tiny_ms.get(c, 0.0)
            rows.append(f"  {c:<12} {b.ms[c]:8.3f} ms {100 * b.share(c):5.1f} %"
                        + (f"   (tiny ops {tiny:.3f} ms)" if tiny > 0 else ""))
    rows.append(f"  ops per step {b.ops_per_step:.0f}; ops under {5:g} us: {100 * b.tiny_share:.1f} % of the step"
                + (f"; {b.note}" if b.note else ""))
    return "\n".join(rows)


def format_diagnosis(d: Diagnosis, memory: str | None = None) -> str:
    """The breakdown, the ranked prescription with a reason each, what was left out and why. ``memory``: the
    memory budget's prescription (:mod:`lab.doctor.memory`), said before the speed one."""
    threads = d.baseline.env.get("torch_threads")
    lines = [f"doctor: {d.cfg.workload}/{d.cfg.size} on {d.hardware_id} (threads {threads})",
             format_breakdown(d.train, "training step")]
    if d.infer is not None:
        batch = d.baseline.details["profile"]["inference"]["batch"]
        lines.append(format_breakdown(d.infer, f"inference (batch {batch})"))
    lines.append(f"rates: {d.rate_source} ({d.calibration_s:.1f} s)")
    run = f" over {d.run.what} ({d.run.steps:,} steps)" if d.run else ""
    if memory:
        lines.append(memory)
    for axis, title in (("train_step", "prescription, training step"), ("inference", "prescription, inference")):
        ps = [p for p in d.predictions if p.axis == axis]
        if ps:
            lines.append(f"{title}{run if axis == 'train_step' else ''} (prescribed when P(faster than the "
                         f"baseline) >= {100 * RULE.confidence:.0f} % and the gain exceeds the A/A noise; ranked by "
                         "the expected time saved, one-off costs included):")
            if d.busy:
                lines.append(f"  nothing prescribed: {BUSY_REFUSAL} ({d.busy})")
            elif d.top(axis) is None:
                lines.append(f"  {NOTHING_PAYS} (no pick is faster than the baseline with P >= "
                             f"{100 * RULE.confidence:.0f} % and a gain beyond the A/A noise x/ "
                             f"{math.exp(d.noise):.2f})")
            lines += [f"  {i}. {p.technique:<17} {p.speedup:5.2f}x [{p.lo:.2f}, {p.hi:.2f}]"
                      + ("" if p.prescribed else "  (not prescribed)") + f"  {p.reason}" for i, p in enumerate(ps, 1)]
    lines += [f"advice: {a}" for a in d.advice]
    if d.skipped:
        lines.append("not predicted: " + "; ".join(f"{k} ({v})" for k, v in d.skipped.items()))
    return "\n".join(lines)


__all__ = ["BUSY_REFUSAL", "MEASURABLE", "Diagnosis", "calibrate", "data_parallel_advice", "diagnose",
           "format_breakdown", "format_diagnosis", "gate"]
