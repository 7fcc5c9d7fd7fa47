"""Part 1, precision: autocast bf16 / fp16 and TF32 against strict fp32 through the lab's PrecisionPolicy, on
ResNet training steps (synthetic images made on the device) and on the ctr workload (speed and AUC delta).
"""

from __future__ import annotations

import contextlib
import copy
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _common import figure
from torch import nn

from lab.measure import median
from lab.precision import PrecisionPolicy, accuracy_verdict, capability, tf32
from lab.workloads import get_workload

from .common import PartContext, block_ms, error_text, free_memory, interleaved_ms, median_figure, ratio_figure, skipped
from .settings import VisionCase

PRECISION_ARMS = (("fp32", "fp32", False), ("tf32", "fp32", True), ("bf16", "bf16", True), ("fp16", "fp16", True))
"""(label, PrecisionPolicy dtype, TF32 allowed). "fp32" is strict fp32 (TF32 off); the mixed arms allow TF32 for
what autocast leaves in fp32, as a tuned run would."""


def _arm_gate(dtype: str, device: torch.device) -> str | None:
    """The lab's capability gate: why ``dtype`` is not native here, or None."""
    if device.type != "cuda" or dtype == "fp32":
        return None
    cap = capability(dtype, device)
    return None if cap.native else f"{cap.why_tag()} ({cap.reason})"


class PlainAutocast:
    """``torch.autocast`` + ``loss.backward()`` + ``optimizer.step()`` and nothing else: the reference that shows
    what the lab's policy costs per step (its diagnostics read the gradient norm, one host sync per step)."""

    def __init__(self, dtype: str, device_type: str) -> None:
        self.dtype, self.device_type = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype], device_type

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, opt: torch.optim.Optimizer) -> None:
        opt.step()


def train_step_fn(model: nn.Module, opt: torch.optim.Optimizer, policy: PrecisionPolicy | PlainAutocast, inputs: tuple,
                  target: torch.Tensor, loss_fn: Callable[..., torch.Tensor], *, allow_tf32: bool,
                  last: dict[str, torch.Tensor]) -> Callable[[], None]:
    """One training step as the lab's loop runs it: forward + loss under the policy's autocast, backward
    and the (scaler-aware) optimizer step outside it. ``last["loss"]`` keeps the latest loss (no sync)."""

    def step() -> None:
        with tf32(allow_tf32):
            with policy.autocast():
                loss = loss_fn(model(*inputs), target)
            policy.backward(loss)
            policy.step(opt)
            opt.zero_grad(set_to_none=True)
        last["loss"] = loss.detach()

    return step


def _check_finite(last: dict[str, dict[str, torch.Tensor]], errors: dict[str, str]) -> None:
    for name, holder in last.items():
        if "loss" in holder and name not in errors and not bool(torch.isfinite(holder["loss"]).all()):
            errors[name] = f"loss became {float(holder['loss'])}"


def precision_vision(ctx: PartContext, case: VisionCase, figs: list[dict[str, Any]]) -> None:
    """ResNet training steps on a fixed synthetic batch made on the device: compute only, no data loading."""
    dev, sz = ctx.device, ctx.sz
    torch.manual_seed(0)
    base = case.make().to(dev).to(memory_format=torch.channels_last)
    x = torch.randn(case.batch, case.channels, case.image, case.image, device=dev)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, case.classes, (case.batch,), device=dev)
    arms: dict[str, Callable[[], None]] = {}
    errors: dict[str, str] = {}
    last: dict[str, dict[str, torch.Tensor]] = {}
    with contextlib.ExitStack() as stack:
        if dev.type == "cuda":
            before = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick its fastest kernels (warm-up)
            stack.callback(setattr, torch.backends.cudnn, "benchmark", before)
        for label, dtype, allow in PRECISION_ARMS:
            why = _arm_gate(dtype, dev)
            if why:
                errors[label] = why
                continue
            m = copy.deepcopy(base)
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            pol = PrecisionPolicy(dtype=dtype, device_type=dev.type)
            stack.enter_context(pol.applied(m))
            last[label] = {}
            arms[label] = train_step_fn(m, opt, pol, (x,), y, F.cross_entropy, allow_tf32=allow, last=last[label])
        if "bf16" in arms:
            m = copy.deepcopy(base)
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            last["bf16-plain"] = {}
            arms["bf16-plain"] = train_step_fn(m, opt, PlainAutocast("bf16", dev.type), (x,), y, F.cross_entropy,
                                               allow_tf32=True, last=last["bf16-plain"])
        samples = interleaved_ms(arms, device=dev, repeats=sz.repeats, iters=sz.vision_iters, warmup=sz.vision_warmup,
                                 deadline=ctx.deadline, min_repeats=sz.min_repeats, errors=errors)
        _check_finite(last, errors)
    for name in errors:
        samples.pop(name, None)
    _precision_figures(f"{case.label}", samples, errors, figs, imgs_per_step=case.batch,
                       goal_bf16=case.goal_bf16_vs_fp32)
    for label, s in samples.items():
        ctx.log(f"  precision {case.label:32s} {label:5s} {median(s):9.3f} ms/step")


def _precision_figures(label: str, samples: dict[str, list[float]], errors: dict[str, str],
                       figs: list[dict[str, Any]], *, imgs_per_step: int | None = None,
                       goal_bf16: float | None = None, unit_name: str = "img/s") -> None:
    fam = "precision"
    for arm, _, _ in PRECISION_ARMS:
        if arm in errors or arm not in samples:
            figs.append(skipped(f"{label}/{arm} speedup vs fp32", errors.get(arm, "no samples"), fam))
    if "fp32" in samples:
        figs.append(median_figure(f"{label}/fp32 step", samples["fp32"], family=fam,
                                  note="strict fp32: TF32 off for matmuls and convolutions"))
    for arm, s in samples.items():
        if imgs_per_step:
            figs.append(figure(f"{label}/{arm} throughput", imgs_per_step * 1e3 / median(s), unit=unit_name,
                               family=fam))
        if arm == "fp32" or "fp32" not in samples:
            continue
        goal = goal_bf16 if arm == "bf16" else None
        figs.append(ratio_figure(
            f"{label}/{arm} speedup vs fp32", samples["fp32"], s, family=fam, goal_min=goal,
            goal=f">= {goal:g}x (NVIDIA AMP tables: mixed precision 2-3x fp32 on ResNet-50)" if goal else None,
            note={"tf32": "", "bf16-plain": "plain torch.autocast, no lab policy: the gap to the bf16 arm is the "
                                             "policy's per-step cost"}.get(
                arm, "lab PrecisionPolicy (reads the grad norm every step: one host sync)")))
    if {"bf16", "bf16-plain"} <= samples.keys():
        figs.append(ratio_figure(f"{label}/bf16 lab policy step vs plain autocast", samples["bf16"],
                                 samples["bf16-plain"], family=fam,
                                 note="> 1: the lab's policy (grad-norm diagnostics, hooks) costs that much per step"))
    for arm in ("bf16", "fp16"):
        if arm in samples and "tf32" in samples:
            figs.append(ratio_figure(f"{label}/{arm} speedup vs tf32", samples["tf32"], samples[arm], family=fam,
                                     note="TF32 is the default-ish fp32 on Ampere+: the realistic baseline"))


def _ctr_run(ctx: PartContext, wl: Any, spec: Any, train: tuple[torch.Tensor, ...], test: tuple[torch.Tensor, ...],
             dtype: str, allow: bool, seed: int) -> tuple[list[float], float]:
    """Train the ctr model for one epoch (or ``ctr_max_steps``) on device-resident data; per-block step times
    (the first block is warm-up and dropped) and the test AUC, evaluated in fp32 as the lab evaluates."""
    dev, sz = ctx.device, ctx.sz
    torch.manual_seed(seed)
    model = wl.make_model(spec).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=spec.lr)
    pol = PrecisionPolicy(dtype=dtype, device_type=dev.type)
    n, bs = len(train[0]), spec.batch_size
    steps = n // bs if sz.ctr_max_steps is None else min(n // bs, sz.ctr_max_steps)
    g = torch.Generator(device=dev).manual_seed(seed)
    perm = torch.randperm(n, device=dev, generator=g)
    blocks: list[float] = []
    last: dict[str, torch.Tensor] = {}
    cursor = 0

    def step() -> None:
        nonlocal cursor
        idx = perm[cursor * bs:(cursor + 1) * bs]
        cursor += 1
        dense, cat, target = (t[idx] for t in train)
        with tf32(allow):
            with pol.autocast():
                loss = wl.loss(model(dense, cat), target)
            pol.backward(loss)
            pol.step(opt)
            opt.zero_grad(set_to_none=True)
        last["loss"] = loss.detach()

    with pol.applied(model):
        while cursor + sz.ctr_block <= steps:
            blocks.append(block_ms(step, sz.ctr_block, dev))
    if not bool(torch.isfinite(last["loss"])):
        raise FloatingPointError(f"ctr {dtype} seed {seed}: loss became {float(last['loss'])}")
    model.eval()
    with torch.no_grad():
        outs = [model(*(t[i:i + 8192].to(dev) for t in test[:-1])).float().cpu() for i in range(0, len(test[0]), 8192)]
    auc = float(wl.evaluate(torch.cat(outs), test[-1])[wl.metric_name])
    return blocks[1:] or blocks, auc


def precision_ctr(ctx: PartContext, figs: list[dict[str, Any]]) -> None:
    """ctr (DLRM) training on the lab's generated click log, arms interleaved run by run, seed = repeat."""
    dev, sz, fam = ctx.device, ctx.sz, "precision"
    wl = get_workload("ctr")
    spec = wl.size(sz.ctr_size)
    t0 = time.perf_counter()
    data = wl.make_data(spec, 0)
    ctx.log(f"  precision ctr/{sz.ctr_size}: generated {len(data.train[0]) + len(data.test[0]):,} rows in "
            f"{time.perf_counter() - t0:.1f} s")
    train = tuple(t.to(dev) for t in data.train)
    samples: dict[str, list[float]] = {}
    aucs: dict[str, list[float]] = {}
    errors: dict[str, str] = {}
    for seed in range(sz.ctr_seeds):
        if seed >= sz.min_repeats and ctx.left_s() < 0:
            break
        for label, dtype, allow in PRECISION_ARMS:
            if label in errors:
                continue
            why = _arm_gate(dtype, dev)
            if why:
                errors[label] = why
                continue
            try:
                blocks, auc = _ctr_run(ctx, wl, spec, train, data.test, dtype, allow, seed)
            except Exception as exc:  # noqa: BLE001
                errors[label] = error_text(exc)
                samples.pop(label, None)
                continue
            samples.setdefault(label, []).extend(blocks)
            aucs.setdefault(label, []).append(auc)
            ctx.log(f"  precision ctr seed {seed} {label:5s} {median(blocks):8.3f} ms/step  auc {auc:.4f}")
    label = f"ctr-{sz.ctr_size}-b{spec.batch_size}"
    _precision_figures(label, samples, errors, figs, imgs_per_step=spec.batch_size, unit_name="rows/s")
    if "fp32" in aucs:
        figs.append(figure(f"{label}/fp32 auc", median(aucs["fp32"]), unit="auc", family=fam,
                           note=f"best reachable (bayes) auc {data.info.get('bayes_auc', float('nan')):.4f}; "
                                f"{len(aucs['fp32'])} seeds"))
        for arm, vals in aucs.items():
            if arm == "fp32":
                continue
            v = accuracy_verdict(aucs["fp32"], vals, higher_is_better=True)
            figs.append(figure(f"{label}/{arm} auc delta vs fp32", v["delta"], unit="auc",
                               goal="< 1 % relative loss", met=v["claim_lt_1pct_holds"], family=fam,
                               note=f"{v['label']} (seed spread {v['seed_spread']:.4g}, {len(vals)} seeds)"))


def part_precision(ctx: PartContext, figs: list[dict[str, Any]]) -> None:
    for case in ctx.sz.vision_cases:
        try:
            precision_vision(ctx, case, figs)
        except Exception as exc:  # noqa: BLE001 - one case failing must not lose the others
            traceback.print_exc()
            figs.append(skipped(f"{case.label}: all arms", error_text(exc), "precision"))
        ctx.checkpoint()
        free_memory()
    precision_ctr(ctx, figs)
