"""From a breakdown and this machine's rates to a predicted speedup per technique, with an interval and a reason.

The model is Amdahl's law over op classes: a technique that makes class ``c`` ``r_c`` times faster turns a
step of shares ``s_c`` into ``sum(s_c / r_c)`` of its time, so ``predicted = 1 / sum(s_c / r_c)``. Loaders are
the exception: a prefetcher does not make reading faster, it *overlaps* it with compute, so its step is
``max(compute, wait) + (1 - e) * min(compute, wait) + handoff`` (overlap efficiency ``e``). Intervals come from
the rates' intervals by Monte-Carlo (log-normal on each side of the estimate), so a rate measured tightly
here gives a narrow prediction and a prior gives a wide one. What each technique touches is read from its
config overrides (``precision.dtype``, ``prune.method``, ``quant.method``, ``data.loader``, ``compute.*``,
``memory.checkpoint``),
so a technique registered later with the same fields is predicted too. Pure functions: tests feed
synthetic breakdowns and rates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lab.config import PruneConfig, QuantConfig
from lab.doctor.amdahl import COMPUTE, Prediction, Rates, _fmt, _pct, amdahl, monte_carlo
from lab.doctor.predict_compile import FUSABLE, compile_step_ms, compile_time_s, predict_compile
from lab.doctor.rates import ONE, Rate, prior
from lab.measure.profile import Breakdown
from lab.precision.inrun import probe_pays
from lab.registry import PREDICTORS


def _split_matmul(b: Breakdown) -> dict[str, float]:
    """Shares of the step: Linear-type matmul, convolution, recurrent (what precision and int8 act on)."""
    mm, conv = b.share("matmul"), (b.conv_ms / b.step_ms if b.step_ms > 0 else 0.0)
    return {"linear": max(mm - conv, 0.0), "conv": conv, "rnn": b.share("recurrent")}


# ------------------------------------------------------------------------------------- the models

def _precision_from_model(name: str, dtype: str, b: Breakdown, r: Rates, rate: Rate) -> Prediction:
    """The model's own forward + backward under ``dtype`` (:func:`lab.doctor.model_rates.model_precision_rates`)
    applied to the classes forward + backward run; the optimizer keeps its fp32 update, plus fp16's
    GradScaler work."""
    shares = {c: b.share(c) for c in COMPUTE}
    rates = dict.fromkeys(shares, rate)
    if dtype == "fp16" and r.grad_scaler is not None and b.share("optimizer") > 0:
        shares["optimizer"] = b.share("optimizer")
        rates["optimizer"] = r.grad_scaler
    s, lo, hi = amdahl(shares, rates)
    fb = sum(b.share(c) for c in COMPUTE)
    mm = sum(_split_matmul(b).values())
    why = (f"forward + backward {_pct(fb)} of the step ({_pct(mm)} matmul / convolution / RNN); this model's "
           f"forward + backward under {dtype} autocast ran {rate.value:.2f}x here ({rate.source})")
    if rate.value < 1:
        why += (": what it adds (casts around every low-precision op, low-precision elementwise ops, slow kernels "
                    "for the dtype) outweighs what the matmuls save at this size")
    if "optimizer" in rates:
        why += f"; GradScaler makes the optimizer {1 / rates['optimizer'].value:.2f}x slower"
    return Prediction(name, "train_step", s, lo, hi, f"{why} -> {dtype} predicted {_fmt(s, lo, hi)}",
                      sorted({x.source for x in rates.values()}))


def predict_precision(name: str, dtype: str, b: Breakdown, r: Rates) -> Prediction:
    """Mixed precision per step. This model's own forward + backward rate wins when it was measured (it
    sees every cast autocast adds); then the crossover map's rate, then the largest layer's, applied to the
    matmul / convolution / RNN shares only."""
    if dtype in r.model_precision:
        return _precision_from_model(name, dtype, b, r, r.model_precision[dtype])
    parts = _split_matmul(b)
    cross = r.crossover.get((name, "train_step"))
    rates = {k: cross or r.precision.get((dtype, k), ONE) for k, v in parts.items() if v > 0}
    shares = dict(parts)
    if dtype == "fp16" and r.grad_scaler is not None and not cross and b.share("optimizer") > 0:
        shares["optimizer"] = b.share("optimizer")  # loss scaling: unscale + inf check + update every step
        rates["optimizer"] = r.grad_scaler
    s, lo, hi = amdahl(shares, rates)
    main = max((k for k in rates if k in parts), key=lambda k: parts[k], default=None)
    if main is None:
        why = f"no matmul, convolution or RNN in the step: {dtype} has nothing to speed up"
    else:
        rt = rates[main]
        why = (f"{_pct(parts[main])} of the step is fp32 {main} work at sizes where {dtype} ran {rt.value:.2f}x "
               f"here ({rt.source})")
        if "optimizer" in rates:
            why += f"; GradScaler makes the optimizer {1 / rates['optimizer'].value:.2f}x slower"
        if b.share("overhead") + b.tiny_share > 0.5:
            why += f"; {_pct(b.share('overhead') + b.tiny_share)} is overhead and tiny ops, which {dtype} cannot touch"
    return Prediction(name, "train_step", s, lo, hi, f"{why} -> {dtype} predicted {_fmt(s, lo, hi)}",
                      sorted({x.source for x in rates.values()}))


def predict_auto(name: str, candidates: list[Prediction], steps: int = 0) -> Prediction:
    """``auto`` probes each low precision on this model and keeps fp32 unless one is clearly faster (its paired
    speedup CI's lower bound above ``1 + lab.precision.auto.AUTO_MIN_GAIN``), so it is predicted as the best
    candidate when that one is predicted at least 5 % faster, else 1.0. A run of ``steps`` too short to repay an
    in-run probe (:func:`lab.precision.inrun.probe_pays`) is not probed and keeps fp32 unless a stored probe of the
    model names a dtype (:mod:`lab.precision.unprobed`): predicted 1.0 (a stored probe is not looked up here).
    The decision is the probe's, made on a measurement, not on this prediction's interval: when the best
    candidate's interval reaches below 1 the probe would keep fp32 there, so the lower bound is ~1.0 rather than
    the candidate's (the probe's own time is a run cost, charged by :func:`lab.doctor.risk.prescribe`)."""
    best = max(candidates, key=lambda p: p.speedup, default=None)
    pays, short = probe_pays(steps, 1 + len(candidates)) if steps and candidates else (True, "")
    if not pays:  # lab.precision.unprobed: a stored probe of this model, else fp32
        return Prediction(name, "train_step", 1.0, 0.97, 1.03, f"auto will not probe: {short}; it keeps fp32 unless "
                          "a stored probe of this model (a longer run's) names a dtype -> predicted 1.00x per step",
                          [])
    if best is not None and best.speedup >= 1.05:  # a point estimate that clears the probe's 1.02 bound in noise
        return Prediction(name, "train_step", best.speedup, max(0.97, min(best.lo, 1.0)) if best.lo < 1.0
                          else best.lo, best.hi,
                          f"auto should pick {best.technique} ({best.reason.split(' -> ')[0]}) -> predicted "
                          f"{_fmt(best.speedup, best.lo, best.hi)} per step (its probe costs extra training time)",
                          best.sources)
    return Prediction(name, "train_step", 1.0, 0.97, 1.03, "no low precision predicted clearly faster: auto "
                      "should keep fp32 -> predicted 1.00x per step (plus its probe's cost)", [])


#: The share of the isolated fused-step saving a training step realises: the median of 26 low-noise verified
#: cases of intel-xeon-processor-amx-2c (|log A/A| < 0.1; committed doctor.json and heldout/) is 0.74, quartiles
#: 0.33-0.93, 3 of 26 below 0.25; 0.8 minimised their median |log error| (0.062 at 1.0 -> 0.034). A prior
#: fitted on those cases, so those cases are in-sample for it.
FUSED_REALISED = prior(0.8, 0.2, 1.05, "share of the isolated fused-step saving realised in a step, fitted on "
                       "this lab's verified cases")


def predict_fused(name: str, b: Breakdown, r: Rates) -> Prediction:
    # The on-the-spot rate is the optimizer class's own (this model's parameters, default vs fused step); the
    # map's is a whole-step ratio of other models, which applied to the class alone under-predicted by about
    # the inverse of their optimizer share (benchmarks/doctor.py: 1.03x predicted, 1.18x measured on vision xs).
    # Only part of the saving the isolated step shows is realised inside a training step (FUSED_REALISED):
    # the default step's per-tensor loop partly overlaps what the step does around it.
    rate = r.fused_optimizer or r.crossover.get((name, "train_step")) or prior(1.3, 0.8, 2.5, "fused optimizer")
    share = b.share("optimizer")

    def frac(v: Mapping[str, Any]) -> Any:
        return 1.0 - share * v["realised"] * (1.0 - 1.0 / v["rate"])

    s, lo, hi = monte_carlo(frac, {"rate": rate, "realised": FUSED_REALISED})
    return Prediction(name, "train_step", s, min(lo, s), max(hi, s),
                      f"optimizer {_pct(share)} of the step, fused step {rate.value:.2f}x here "
                      f"({rate.source}), {FUSED_REALISED.value:.0%} of its saving realised in a step "
                      f"({FUSED_REALISED.source}) -> predicted {_fmt(s, min(lo, s), max(hi, s))}",
                      [rate.source, FUSED_REALISED.source])


def predict_fast_kernels(name: str, b: Breakdown, r: Rates, axis: str = "train_step") -> Prediction:
    rate = r.crossover.get((name, axis)) or r.fast_kernels or ONE
    shares = {c: b.share(c) for c in COMPUTE}
    s, lo, hi = amdahl(shares, dict.fromkeys(shares, rate))
    return Prediction(name, axis, s, lo, hi, f"forward + backward {_pct(sum(shares.values()))} of the step; the "
                      f"workload's fast kernels ran {rate.value:.2f}x on one batch ({rate.source}) -> predicted "
                      f"{_fmt(s, lo, hi)}", [rate.source])


def predict_checkpoint(name: str, b: Breakdown, r: Rates) -> Prediction | None:
    """Activation checkpointing per block: one more forward of the blocks in backward, a cost on forward + backward
    only. Its rate is this model's own forward + backward with its blocks checkpointed (or the map's row); no
    rate, no prediction (a model without blocks is refused by the run)."""
    rate = r.crossover.get((name, "train_step")) or r.checkpoint
    if rate is None:
        return None
    shares = {c: b.share(c) for c in COMPUTE}
    s, lo, hi = amdahl(shares, dict.fromkeys(shares, rate))
    return Prediction(name, "train_step", s, lo, hi, f"forward + backward {_pct(sum(shares.values()))} of the "
                      f"step; with its blocks recomputed in backward they ran {rate.value:.2f}x ({rate.source}) -> "
                      f"predicted {_fmt(s, lo, hi)} (a memory lever: it trades time for saved activations)",
                      [rate.source])


def predict_loader(name: str, b: Breakdown, workers: int, r: Rates, readers: int = 1) -> Prediction:
    """A background loader overlaps the data wait with compute (a thread: ``workers=0``, with ``readers`` reads
    in flight; processes: more). Without a measurement, ``readers`` splits the wait like workers do: the reads'
    round trips overlap (their transfers do not, which the prior cannot see: a measurement can)."""
    wait = b.share("data_wait")
    compute = 1.0 - wait
    step_ms = max(b.step_ms, 1e-6)
    thread = "a thread prefetcher" + (f" with {readers} reads in flight" if readers > 1 else "")
    measured = r.thread_loader_ms if readers == 1 else r.thread_readers_ms.get(readers)
    if workers == 0 and measured is not None:
        return _loader_measured(name, b, measured, thread)
    if workers > 0 and r.worker_loader_ms.get(workers) is not None:
        return _loader_measured(name, b, r.worker_loader_ms[workers], f"{workers} loader worker processes")
    if workers == 0:
        params = {"eff": Rate(0.9, 0.6, 1.0, "prior: overlap efficiency of a thread (the GIL)"),
                  "handoff": Rate(0.05 / step_ms, 0.02 / step_ms, 0.3 / step_ms, "prior: queue hand-off per batch"),
                  "slow": ONE}
    else:
        ipc_ms = 0.4 + r.batch_bytes / 1e6  # ~1 GB/s through shared memory, plus a fixed cost per batch
        params = {"eff": Rate(0.95, 0.7, 1.0, "prior: overlap efficiency of worker processes"),
                  "handoff": Rate(ipc_ms / step_ms, 0.4 * ipc_ms / step_ms, 3 * ipc_ms / step_ms,
                                  "prior: inter-process hand-off per batch"),
                  "slow": Rate(1.1, 1.0, 1.4, "prior: workers share the cores with compute")}
    per = wait / max(workers, readers if workers == 0 else 1, 1)

    def frac(v: Mapping[str, Any]) -> Any:
        c = compute * v["slow"]
        return np.maximum(c, per) + (1 - v["eff"]) * np.minimum(c, per) + v["handoff"]

    s, lo, hi = monte_carlo(frac, params)
    kind = thread if workers == 0 else f"{workers} loader worker processes"
    lead = (f"data wait {_pct(wait)} of the step -> {kind}" if wait >= 0.1 else
            f"data wait only {_pct(wait)}: {kind} has little to hide and adds a hand-off per batch")
    return Prediction(name, "train_step", s, lo, hi, f"{lead}, predicted {_fmt(s, lo, hi)}",
                      sorted({x.source for x in params.values()}))


def _loader_measured(name: str, b: Breakdown, extra: Rate, kind: str) -> Prediction:
    """The step without its data wait, plus what one batch from the technique's loader measured beside this
    model's forward + backward (:func:`lab.doctor.model_rates.loader_extra_ms`): the reading it cannot hide, the
    hand-off, and for a thread the GIL the two threads share, for worker processes the cores they take."""
    wait_ms = b.ms.get("data_wait", 0.0)
    rest = max(b.step_ms - wait_ms, 1e-9)

    def speed(extra_ms: float) -> float:
        return b.step_ms / (rest + extra_ms)

    s, lo, hi = speed(extra.value), speed(extra.hi), speed(extra.lo)
    lead = (f"data wait {_pct(b.share('data_wait'))} of the step ({wait_ms:.2f} ms)" if b.share("data_wait") >= 0.1
            else f"data wait only {_pct(b.share('data_wait'))} ({wait_ms:.2f} ms): little to hide")
    return Prediction(name, "train_step", s, min(lo, s), max(hi, s),
                      f"{lead}; a batch from {kind} added {extra.value:.2f} ms beside this model's "
                      f"forward + backward ({extra.source}) -> predicted {_fmt(s, min(lo, s), max(hi, s))}",
                      [extra.source])


def predict_masks(name: str, amount: float) -> Prediction:
    rate = prior(1.0, 0.92, 1.08, "masked weights are still multiplied by dense kernels")
    return Prediction(name, "inference", rate.value, rate.lo, rate.hi,
                      f"{amount:.0%} of the weights zeroed by masks: dense kernels skip no work -> predicted "
                      f"{_fmt(rate.value, rate.lo, rate.hi)} ({rate.source})", [rate.source])


def predict_channels(name: str, amount: float, b: Breakdown, r: Rates) -> Prediction:
    cross = r.crossover.get((name, "inference"))
    tiny_mm = min(b.tiny_ms.get("matmul", 0.0) / max(b.step_ms, 1e-9), b.share("matmul"))
    shares = {"matmul": b.share("matmul") - tiny_mm, "narrow": b.share("elementwise") + b.share("norm")}
    keep = 1.0 - amount
    rates = {"matmul": cross or prior(1 / keep ** 1.5, 1 / keep, 1 / keep ** 2, "MACs of pruned layers shrink "
                                                                                 "~keep..keep^2"),
             "narrow": cross or prior(1 / keep ** 0.5, 1.0, 1 / keep, "narrower activations")}
    s, lo, hi = amdahl(shares, rates)
    return Prediction(name, "inference", s, lo, hi,
                      f"non-tiny matmul/conv {_pct(shares['matmul'])} of inference (tiny ones are dispatch-bound and "
                      f"stay), {amount:.0%} of channels removed -> predicted {_fmt(s, lo, hi)}",
                      sorted({x.source for x in rates.values()}))


def predict_int8(name: str, method: str, b: Breakdown, r: Rates) -> Prediction:
    parts = _split_matmul(b)
    cross = r.crossover.get((name, "inference"))
    lin = r.dynamic_int8 or prior(1.2, 0.6, 2.5, "int8 Linear")
    rates: dict[str, Rate] = {}
    if parts["linear"] > 0:
        rates["linear"] = cross or (lin if method == "dynamic" else
                                    prior(lin.value * 1.2, lin.lo, lin.hi * 1.5, "static int8 Linear ~ dynamic x1.2"))
    if parts["conv"] > 0 and method != "dynamic":
        rates["conv"] = cross or prior(2.2, 1.2, 4.0, "static int8 convolution (oneDNN / fbgemm)")
    if parts["rnn"] > 0 and method == "dynamic":
        rates["rnn"] = cross or prior(0.9, 0.5, 1.6, "dynamic int8 LSTM / GRU")
    shares = dict(parts)
    if method != "dynamic" and parts["conv"] > 0:
        shares["norm"] = b.share("norm")  # BatchNorm folds into the int8 convolution
        rates["norm"] = cross or prior(3.0, 1.5, 10.0, "BatchNorm folded into the convolution")
    s, lo, hi = amdahl(shares, rates)
    what = ", ".join(f"{k} {_pct(shares[k])} at {v.value:.2f}x" for k, v in rates.items()) or "nothing int8 can take"
    return Prediction(name, "inference", s, lo, hi, f"{method} int8 of inference: {what} -> predicted "
                      f"{_fmt(s, lo, hi)}", sorted({x.source for x in rates.values()}))


@dataclass(frozen=True)
class Ask:
    """One technique to predict: its name and overrides, the measured breakdowns, this machine's rates."""

    name: str
    overrides: Mapping[str, Any]
    train: Breakdown
    infer: Breakdown | None
    rates: Rates
    precision_preds: list[Prediction]


Predictor = Callable[[Any, Ask], "Prediction | None"]


def _precision(dtype: Any, a: Ask) -> Prediction | None:
    if dtype == "auto":
        return predict_auto(a.name, a.precision_preds, a.rates.steps)
    return predict_precision(a.name, dtype, a.train, a.rates)


def _loader(loader: Any, a: Ask) -> Prediction | None:
    if loader == "thread":
        return predict_loader(a.name, a.train, 0, a.rates, int(a.overrides.get("data.prefetch_readers", 1)))
    if loader == "dataloader":
        return predict_loader(a.name, a.train, int(a.overrides.get("data.num_workers", 0)), a.rates)
    return None


def _pruning(method: Any, a: Ask) -> Prediction | None:
    if a.infer is None:
        return None
    amount = float(a.overrides.get("prune.amount", 0.5))
    if method == "structured_channels":
        return predict_channels(a.name, amount, a.infer, a.rates)
    return predict_masks(a.name, amount) if method in PruneConfig.MASK_METHODS else None


def _int8(method: Any, a: Ask) -> Prediction | None:
    if a.infer is None or method not in QuantConfig.INT8_METHODS:
        return None
    return predict_int8(a.name, method, a.infer, a.rates)


# The doctor's predictors, by the config field a technique sets (asked in this order; the first that predicts
# wins): a technique registered later that sets one of these fields is predicted with no change here.
for _field, _predictor in (
        ("precision.dtype", _precision),
        ("compute.fused_optimizer", lambda on, a: predict_fused(a.name, a.train, a.rates) if on else None),
        ("compute.compile", lambda on, a: predict_compile(a.name, a.train, a.rates) if on else None),
        ("compute.fast_kernels", lambda on, a: predict_fast_kernels(a.name, a.train, a.rates) if on else None),
        ("data.loader", _loader),
        ("prune.method", _pruning),
        ("quant.method", _int8),
        ("memory.checkpoint", lambda how, a: predict_checkpoint(a.name, a.train, a.rates) if how == "blocks"
         else None)):
    PREDICTORS.register(_field, _predictor, overwrite=True)  # overwrite: importlib.reload stays idempotent


def predict_technique(name: str, overrides: Mapping[str, Any], axes: tuple[str, ...], train: Breakdown,
                      infer: Breakdown | None, r: Rates, precision_preds: list[Prediction] | None = None
                      ) -> Prediction | None:
    """The first registered predictor (:data:`lab.registry.PREDICTORS`) for a field the technique's overrides set
    that gives a prediction; ``None`` when no model here covers it."""
    ask = Ask(name, dict(overrides), train, infer, r, precision_preds or [])
    for field, predictor in PREDICTORS.items():
        if field in ask.overrides:
            prediction = predictor(ask.overrides[field], ask)
            if prediction is not None:
                return prediction
    return None


def larger_batch_advice(b: Breakdown, factor: int = 2) -> tuple[float, str]:
    """Per-sample speedup of a ``factor`` times larger batch: per-step costs (overhead, tiny ops, optimizer)
    are paid once per step, the rest grows with the batch. Advice only: a batch change also changes the
    optimisation, so it is not a technique the lab verifies."""
    fixed = min(b.share("overhead") + b.tiny_share + b.share("optimizer"), 1.0)
    s = factor / (fixed + factor * (1 - fixed))
    return s, (f"per-step costs (overhead, tiny ops, optimizer) are {_pct(fixed)} of the step -> a {factor}x batch "
               f"would process samples about {s:.2f}x faster (changes the optimisation: retune the lr)")


def rank(predictions: list[Prediction]) -> list[Prediction]:
    """Best first by the model alone, per axis (training step first): by the central prediction, ties by the lower
    bound. Not the prescription: that one ranks by the interval's lower end over the run, one-off costs charged,
    and drops what noise explains (:func:`lab.doctor.risk.prescribe`: ranked by a point estimate, a compile whose
    interval reached 0.69 was once first on a minimal GPT and measured 0.75x)."""
    order = {"train_step": 0, "inference": 1}
    return sorted(predictions, key=lambda p: (order.get(p.axis, 2), -p.speedup, -p.lo))


__all__ = ["Ask", "COMPUTE", "FUSABLE", "FUSED_REALISED", "Prediction", "Predictor", "Rates", "amdahl",
           "compile_step_ms", "compile_time_s", "larger_batch_advice", "monte_carlo", "predict_technique", "rank"]
