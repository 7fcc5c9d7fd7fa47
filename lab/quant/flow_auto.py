"""``--quant-flow auto``: legacy torch.ao or PT2E, whichever int8 model is faster on the run's own model and batch.

Why measured: neither flow wins everywhere. PT2E compiled by Inductor fuses conv / linear with their quantize /
dequantize into oneDNN int8 kernels and wins on conv nets (vision small: 3.6x fp32 eager), while on ctr's small
Linears PT2E dynamic read 0.21x fp32 compiled where legacy dynamic was faster; which one pays depends on the
layers' sizes, the batch and the CPU, so a fixed default leaves a gain on the table somewhere.

What it times (:func:`probe_flows`): both flows quantize the run's trained model (same method, same calibration
batches); the two int8 models are timed on the run's own inference batch (``eval_batch_size`` rows of the test
split), interleaved block by block (:func:`lab.measure.inference_latency_ms`), so the drift of a shared machine
hits both alike. A sample is the mean of a block of back-to-back calls lasting about :data:`BLOCK_MS` for the
faster flow: on a model whose call takes 0.1 ms a single call is clock noise, and the crossover map showed the
per-call probe taking legacy (0.65x fp32) over PT2E (1.48x) on vision xs as "within noise". PT2E's compile
happens before the timing (its warm-up) and is reported apart (``probe_s``).

The rule (:data:`RULE`, :func:`decide_flow`, pure and tested on planted timings): the paired ratio per repeat
``legacy ms / pt2e ms``, its median and a 95 % bootstrap CI over the repeats. CI above 1: PT2E is faster,
decisively; below 1: legacy is. A CI that spans 1 (or fewer than :data:`MIN_REPEATS` repeats) is not decisive:
the flow faster by the paired median is taken and the record says the two are within noise. So where the probe is
decisive auto takes the faster candidate (never > 5 % slower than the best one). A flow that cannot run this
model / config (torchao missing, a PT2E refusal, a legacy model that FX cannot trace, an RNN that PT2E sends to
legacy anyway, a model torch.export cannot trace) is not a candidate, and the record says why. The chosen flow's
record is the run's ``details["quant"]`` with ``details["quant"]["auto"]`` beside it. QAT is refused with auto (it
would fine-tune twice); ``--quant-flow pt2e`` / ``legacy`` choose it by hand.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from lab import measure
from lab.config import QuantConfig

#: Fewer paired repeats than this never make a decisive probe.
MIN_REPEATS = 5
#: A probe sample is the mean of back-to-back calls lasting about this long for the faster flow (at most
#: :data:`MAX_ITERS` calls; a call longer than this is one sample by itself).
BLOCK_MS, MAX_ITERS = 20.0, 64
CANDIDATES = ("pt2e", "legacy")
RULE = ("both flows quantize the run's model; their int8 models are timed on the run's inference batch, "
        f"interleaved in blocks of ~{BLOCK_MS:g} ms of calls; paired ratio legacy ms / pt2e ms per repeat, 95 % "
        "bootstrap CI of its median over >= "
        f"{MIN_REPEATS} repeats: CI above 1 -> pt2e, below 1 -> legacy (decisive); a CI spanning 1 -> the faster by "
        "the paired median, said to be within noise")
WHY_NO_QAT = ("quant.flow='auto' is invalid with quant.method='qat': the probe would fine-tune the model twice; "
              "pick --quant-flow pt2e or legacy")


def decide_flow(samples_ms: Mapping[str, Sequence[float]], *, seed: int = 0) -> dict[str, Any]:
    """The flow auto takes from per-repeat latency samples of each candidate (same length, interleaved), and
    why. One candidate: taken, nothing timed against. Pure: tested on planted timings."""
    names = [n for n in CANDIDATES if n in samples_ms]
    if not names:
        raise ValueError("quant.flow='auto' has no candidate flow to run for this model")
    medians = {n: float(np.median(samples_ms[n])) for n in names}
    if len(names) == 1:
        return {"chosen": names[0], "decisive": False, "rule": RULE, "median_ms": medians,
                "why": f"only {names[0]} can quantize this model / config"}
    legacy, pt2e = (np.asarray(samples_ms[n], dtype=float) for n in ("legacy", "pt2e"))
    ratios = legacy / pt2e
    est, lo, hi = measure.bootstrap_ci(ratios, seed=seed)
    enough = len(ratios) >= MIN_REPEATS
    if enough and lo > 1.0:
        chosen, decisive, why = "pt2e", True, f"pt2e faster: legacy / pt2e {est:.2f}x [{lo:.2f}, {hi:.2f}]"
    elif enough and hi < 1.0:
        chosen, decisive, why = "legacy", True, f"legacy faster: legacy / pt2e {est:.2f}x [{lo:.2f}, {hi:.2f}]"
    else:
        chosen = "pt2e" if est > 1.0 else "legacy"
        decisive = False
        why = (f"within noise (legacy / pt2e {est:.2f}x [{lo:.2f}, {hi:.2f}]"
               + ("" if enough else f", {len(ratios)} < {MIN_REPEATS} repeats")
               + f"): {chosen}, the faster by the paired median")
    return {"chosen": chosen, "decisive": decisive, "rule": RULE, "median_ms": medians,
            "paired_ratio_legacy_over_pt2e": {"ratio": est, "ci_lo": lo, "ci_hi": hi, "repeats": len(ratios)},
            "why": why}


def block_iters(call_ms: float) -> int:
    """Calls per probe sample for a call of ``call_ms``: enough for ~:data:`BLOCK_MS`, 1 to :data:`MAX_ITERS`."""
    return max(1, min(MAX_ITERS, math.ceil(BLOCK_MS / max(call_ms, 1e-3))))


def candidate_refusals(model: nn.Module, qc: QuantConfig) -> dict[str, str]:
    """Why each flow that cannot run ``model`` under ``qc`` is not a candidate (empty: both can)."""
    from lab.quant import int8, pt2e

    out: dict[str, str] = {}
    try:
        pt2e.check_available()
        pt2e.check_pt2e_config(dataclasses.replace(qc, flow="pt2e"))
        if qc.method == "dynamic" and pt2e.has_rnn(model):
            out["pt2e"] = pt2e.WHY_RNN_FALLBACK
    except ValueError as exc:
        out["pt2e"] = str(exc)
    if qc.method == "static":
        try:
            int8.check_fx_traceable(model, qc.method)
        except (ValueError, TypeError) as exc:
            out["legacy"] = str(exc).splitlines()[0]
    return out


def probe_flows(model: nn.Module, qc: QuantConfig, quantize: Callable[[QuantConfig], tuple[nn.Module, dict]],
                inputs: tuple[torch.Tensor, ...], *, repeats: int) -> tuple[nn.Module, dict[str, Any]]:
    """Quantize ``model`` with every candidate flow (``quantize(qc_with_flow)``), time the int8 models on
    ``inputs`` interleaved, keep the one :func:`decide_flow` takes: ``(model, its info with info["auto"])``."""
    if qc.method == "qat":
        raise ValueError(WHY_NO_QAT)
    refused = candidate_refusals(model, qc)
    t0 = time.perf_counter()
    built = {flow: quantize(dataclasses.replace(qc, flow=flow)) for flow in CANDIDATES if flow not in refused}
    for flow, (_, info) in list(built.items()):  # pt2e that fell back (torch.export failed) is the legacy candidate
        if info.get("flow") != flow and info["flow"] in built:
            refused[flow] = info.get("flow_fallback") or f"{flow} ran as {info['flow']}"
            del built[flow]
    iters = 1
    if len(built) > 1:
        models = {f: q for f, (q, _) in built.items()}
        # warm-up (PT2E compiles at this batch) and one call each, to size the blocks
        one = measure.inference_latency_ms(models, inputs, repeats=1, warmup=2)
        iters = block_iters(min(ms[0] for ms in one.values()))
        samples = measure.inference_latency_ms(models, inputs, repeats=max(repeats, MIN_REPEATS), warmup=0,
                                               iters=iters)
    else:
        samples = {f: [] for f in built}
    decision = decide_flow({f: s or [float("nan")] for f, s in samples.items()})
    decision.update(candidates=list(CANDIDATES), not_candidates=refused, probe_s=time.perf_counter() - t0,
                    batch=len(inputs[0]), calls_per_sample=iters)
    q, info = built[decision["chosen"]]
    info["auto"] = decision
    return q, info


__all__ = ["BLOCK_MS", "block_iters", "CANDIDATES", "candidate_refusals", "decide_flow", "MAX_ITERS", "MIN_REPEATS",
           "probe_flows", "RULE", "WHY_NO_QAT"]
