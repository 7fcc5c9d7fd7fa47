"""Mixed precision on each workload: fp32 vs bf16 vs fp16 vs auto (and TF32 / channels_last on CUDA).

    python benchmarks/precision.py [--quick] [--json PATH]

Arms run interleaved (A B C D, A B C D, ...) so drift on a shared machine hits every arm alike; repeat i uses
seed i, so the accuracy comparison is against the seed-to-seed spread (``precision.accuracy_verdict``). Figures
per workload and arm: step-time speedup vs fp32 (ratio of medians over all measured steps, bootstrap 95 % CI),
peak memory ratio (process RSS on CPU, ``max_memory_allocated`` on CUDA) and the metric delta. Goals: ``auto`` is
never more than 5 % slower than fp32; the fp32 policy adds <= 1 % to a step. Sizes: ``--quick`` uses ``tiny``
(seconds on a laptop CPU); the full setting uses ``small`` and fits in 5 minutes on one H200.

GPU part (``gpu_part``, run by ``benchmarks/gpu.py``, not by this script): CUDA autocast bf16, fp16 (+ GradScaler)
and TF32 against strict fp32 (TF32 off), through the lab's own :class:`lab.precision.PrecisionPolicy`,
channels_last (NCHW in the CPU self-test: see ``precision_vision``), on ResNet-50 training steps over synthetic
images generated on the GPU (an ImageNet-like shape and the vision workload's own 28x28 shape), and on the ctr
workload (data from the lab's own generator) with the AUC delta against fp32 over seeds. A plain ``torch.autocast``
bf16 arm (no lab policy) shows what the policy's per-step diagnostics cost. An arm far slower than fp32 on one
probe call (no fast kernel here) is skipped with that reason rather than timed past the budget. Anchor: NVIDIA's
AMP training tables (ResNet-50: mixed precision ~2-3x the fp32 throughput; TF32 most of that on Ampere+). Goal:
bf16 >= 2x strict fp32 on the ImageNet-like ResNet-50; < 1 % relative AUC loss.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _common import emit, figure, median_figure, parse_args, ratio_figure, skipped
from _gpu import PartContext, VisionCase, drop_slow_arms, free_memory
from torch import nn

from lab import RunConfig, run
from lab.measure import block_ms, bootstrap_ratio_ci, error_text, interleaved_ms, median
from lab.precision import FP32, NotApplicable, PrecisionPolicy, accuracy_verdict, capability, tf32
from lab.workloads import get_workload, register_workload

CPU_ARMS = ("fp32", "bf16", "fp16", "auto")


def channels_last_workload(name: str) -> str:
    """Register ``<name>_cl``: the same workload with the model in channels_last memory format (conv nets)."""
    wl = get_workload(name)

    def make_model(spec):  # noqa: ANN001, ANN202 - same signature as the wrapped factory
        return wl.make_model(spec).to(memory_format=torch.channels_last)

    register_workload(dataclasses.replace(wl, name=f"{name}_cl", make_model=make_model), overwrite=True)
    return f"{name}_cl"


def fp32_policy_cost_us(n: int = 20_000) -> float:
    """Per-step cost of the no-op fp32 policy (autocast null context + step dispatch), on empty steps."""

    class _NoOpt:
        def step(self) -> None:
            pass

    opt = _NoOpt()

    def empty_step() -> None:
        with FP32.autocast():
            pass
        FP32.step(opt)  # type: ignore[arg-type]

    return block_ms(empty_step, n) * 1e3  # one block of n back-to-back calls, no sync: CPU only


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    size, steps, repeats = ("tiny", 30, 2) if args.quick else ("small", 60, 3)
    device = "cuda" if cuda else "cpu"
    arms: list[tuple[str, str, str, bool]] = [(a, w, a, False) for w in ("ctr", "sequence", "vision")
                                              for a in CPU_ARMS]  # (label, workload, dtype, tf32)
    if cuda:
        arms += [("tf32", w, "fp32", True) for w in ("ctr", "sequence", "vision")]
        cl = channels_last_workload("vision")
        arms += [("channels_last", cl, "fp32", False), ("channels_last+bf16", cl, "bf16", False)]
    runs: dict[tuple[str, str], list] = {}
    refused: dict[tuple[str, str], str] = {}
    for rep in range(repeats):
        for label, workload, dtype, use_tf32 in arms:
            # fp16 convolutions on a CPU run ~30x slower than fp32 (no fast kernels): a few steps give the ratio.
            n_steps = min(steps, 8 if args.quick else 15) \
                if dtype == "fp16" and not cuda and workload.startswith("vision") else steps
            cfg = RunConfig(workload=workload, size=size, max_steps=n_steps, threads=1, latency_repeats=0,
                            warmup_steps=5, seed=rep, device=device).with_overrides(**{"precision.dtype": dtype})
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            try:
                with tf32(use_tf32) if cuda else contextlib.nullcontext():
                    res = run(cfg)
            except NotApplicable as exc:  # the model gate (fp16 convolutions on a CPU): refused before training
                refused[(workload, label)] = str(exc)
                continue
            runs.setdefault((workload, label), []).append(res)
            print(f"  rep {rep} {workload:12s} {label:20s} {res.median_step_ms:8.2f} ms/step  {res.why}")

    figures, decisions = [], {}
    for (workload, label), why in refused.items():
        figures.append(figure(f"{workload}/{label} speedup vs fp32", float("nan"), unit="x",
                              note=f"does not apply here: {why}"[:200]))
    for (workload, label), rs in runs.items():
        base_wl = workload.removesuffix("_cl")
        base = runs[(base_wl, "fp32")]
        if label == "fp32" and workload == base_wl:
            figures.append(figure(f"{workload}/fp32 median step", median([r.median_step_ms for r in rs]), unit="ms"))
            continue
        est, lo, hi = bootstrap_ratio_ci([t for r in base for t in r.measured_ms()],
                                         [t for r in rs for t in r.measured_ms()])
        goal = ">= 0.95 (never >5 % slower)" if label == "auto" else None
        resolved = ",".join(r.details.get("precision", {}).get("resolved", "fp32") for r in rs)  # per repeat
        figures.append(figure(f"{workload}/{label} speedup vs fp32", est, unit="x", ci=(lo, hi), goal=goal,
                              met=(est >= 0.95) if goal else None,
                              note=f"ran {resolved}; " + ("auto ran fp32 in every repeat, so any gap to fp32 is "
                                                          "measurement noise; " if set(resolved.split(",")) == {"fp32"}
                                                          and label == "auto" else "") + "; ".join(rs[0].why)[:200]))
        mem = median([r.peak_memory_mb for r in rs]) / median([r.peak_memory_mb for r in base])
        figures.append(figure(f"{workload}/{label} peak memory vs fp32", mem, unit="x",
                              note=f"{rs[0].memory_kind} (CPU RSS includes interpreter and data)"))
        if rs[0].steps != base[0].steps:  # a step-capped arm (CPU fp16 convs): its accuracy is not comparable
            figures.append(figure(f"{workload}/{label} {rs[0].metric_name} delta", float("nan"),
                                  unit=rs[0].metric_name, note=f"not compared: this arm trained {rs[0].steps} "
                                  f"steps against fp32's {base[0].steps} (speed only)"))
        else:
            verdict = accuracy_verdict([r.metric for r in base], [r.metric for r in rs],
                                       higher_is_better=rs[0].higher_is_better)
            figures.append(figure(f"{workload}/{label} {rs[0].metric_name} delta", verdict["delta"],
                                  unit=rs[0].metric_name, goal="< 1 % relative loss (seed claim)",
                                  met=verdict["claim_lt_1pct_holds"],
                                  note=f"{verdict['label']} (seed spread {verdict['seed_spread']:.4g})"))
        if label == "auto":
            decisions[workload] = rs[0].details["precision"].get("auto", {}).get("why")

    cost_us = median([fp32_policy_cost_us() for _ in range(3)])
    step_ms = median([r.median_step_ms for r in runs[("ctr", "fp32")]])
    figures.append(figure("fp32 policy cost per step", cost_us / (step_ms * 1e3) * 100, unit="% of ctr step",
                          goal="<= 1 %", met=cost_us / (step_ms * 1e3) <= 0.01, note=f"{cost_us:.2f} us"))
    gate = {d: dataclasses.asdict(capability(d, device)) for d in ("bf16", "fp16")}
    emit("precision", args, figures, gate=gate, auto_decisions=decisions, size=size, steps=steps, repeats=repeats)


# ------------------------------------------------------------------------------------------------ GPU part

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
    """ResNet training steps on a fixed synthetic batch made on the device: compute only, no data loading.

    channels_last on CUDA only (what the tensor cores want). On a CPU the model and batch stay NCHW: oneDNN
    3.12's ``jit_1x1`` backward-weights kernel for an NHWC source writes past its reduce-to-unit-stride
    workspace when a 1x1 convolution has stride 2 and fewer input channels than its block (8 on AVX2, 16 on
    AVX-512): the tiny ResNet's 4 -> 8 shortcut on an AVX2 CPU (AMD Zen 3, or ``ONEDNN_MAX_CPU_ISA=AVX2``) aborts
    the interpreter ("corrupted size vs. prev_size") or, with 2 threads, hangs; bigger batches hit it on AVX-512
    too (uxlfoundation/oneDNN#6035). NCHW takes oneDNN's blocked path, which is correct."""
    dev, sz = ctx.device, ctx.sz
    fmt = torch.channels_last if dev.type == "cuda" else torch.contiguous_format
    torch.manual_seed(0)
    base = case.make().to(dev).to(memory_format=fmt)
    x = torch.randn(case.batch, case.channels, case.image, case.image, device=dev)
    x = x.contiguous(memory_format=fmt)
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
        drop_slow_arms(arms, reference="fp32", sync=dev, errors=errors)  # its call is the first warm-up call
        samples = interleaved_ms(arms, repeats=sz.repeats, iters=sz.vision_iters, warmup=max(0, sz.vision_warmup - 1),
                                 sync=dev, deadline=ctx.deadline, min_repeats=sz.min_repeats, errors=errors)
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
    for arm in dict.fromkeys([*(a for a, _, _ in PRECISION_ARMS), *errors]):  # + bf16-plain, when it failed
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
    t0 = time.perf_counter()  # one event's wall time, for the progress log only (not a figure)
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


def gpu_part(ctx: PartContext, figs: list[dict[str, Any]]) -> None:
    """Each ResNet case (a failing case is an entry, the others go on), then the ctr workload."""
    for case in ctx.sz.vision_cases:
        try:
            precision_vision(ctx, case, figs)
        except Exception as exc:  # noqa: BLE001 - one case failing must not lose the others
            traceback.print_exc()
            figs.append(skipped(f"{case.label}: all arms", error_text(exc), "precision"))
        ctx.checkpoint()
        free_memory()
    precision_ctr(ctx, figs)


if __name__ == "__main__":
    main()
