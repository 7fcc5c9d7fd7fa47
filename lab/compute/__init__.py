"""Compute options: the same math executed faster. ``compute.fused_optimizer`` (one fused Adam/SGD kernel
instead of a loop of small ones), ``compute.fast_kernels`` (a workload's faster implementation of the same
model, its ``Workload.fast_kernels`` hook) and ``compute.compile`` (``torch.compile`` of the training forward,
compile time counted in the training time). None of them changes the parameters or the loss, so accuracy
may differ only by float rounding. Taught in ``notebooks/06_ablations.ipynb`` (the speed stack).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lab.config import RunConfig
from lab.context import FitPlan, TrainContext
from lab.loop import StepHook
from lab.result import RunResult
from lab.workloads import get_workload, list_workloads


def check(cfg: RunConfig) -> None:
    """Refuse what cannot run before any work: fast kernels for a workload without them; compile with DDP."""
    if cfg.compute.fast_kernels and get_workload(cfg.workload).fast_kernels is None:
        raise ValueError(f"compute.fast_kernels=True is invalid for workload {cfg.workload!r}: it has no faster "
                         "implementation (workloads with one: "
                         + ", ".join(n for n in list_workloads() if get_workload(n).fast_kernels) + ")")
    if cfg.compute.compile and cfg.ddp.enabled:
        raise ValueError("compute.compile=True is invalid with ddp: compiling the DDP-wrapped model is not wired "
                         "up in this lab yet; compare compile on a single process")


def before_training(ctx: TrainContext, model: nn.Module) -> tuple[nn.Module, list[StepHook]]:
    """Switch to the workload's fast kernels (same parameters, same math)."""
    if ctx.cfg.compute.fast_kernels:
        model = ctx.workload.fast_kernels(model)
    return model, []


def fit_options(ctx: TrainContext, model: nn.Module, plan: FitPlan) -> None:
    """Fused optimizer for every fit; ``torch.compile`` for the main training phase only (fine-tunes after
    pruning or QAT change the module structure and run eagerly). Compilation happens in the first step,
    inside the timing."""
    plan.fused_optimizer = ctx.cfg.compute.fused_optimizer
    if ctx.cfg.compute.compile and plan.phase == "train":
        plan.forward = torch.compile(model)


def after_training(ctx: TrainContext, model: nn.Module) -> nn.Module:
    return model


def report(result: RunResult) -> dict[str, Any]:
    """Which compute options ran."""
    cfg = (result.config or {}).get("compute", {})
    return {k: bool(cfg.get(k, False)) for k in ("fused_optimizer", "fast_kernels", "compile")}
