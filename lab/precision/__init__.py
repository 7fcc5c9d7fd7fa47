"""Mixed precision for the one training loop: autocast policy, capability gate, ``auto``, fp32 islands.

The family's door (see :mod:`lab.context`): ``fit_options`` hands every fit of a run the
:class:`PrecisionPolicy` its config asks for (``auto`` is resolved once, by measuring) and records the
policy's diagnostics per phase in ``result.details["precision"]``; ``before_training`` checks the
``fp32_modules`` names against the model before any training. Taught in ``notebooks/02_mixed_precision.ipynb``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lab.config import RunConfig
from lab.context import FitPlan, TrainContext
from lab.loop import StepHook
from lab.precision import gate, policy
from lab.precision.gate import *  # noqa: F403 - the names in its __all__
from lab.precision.gate import NotApplicable, model_gate, policy_for
from lab.precision.policy import *  # noqa: F403 - the names in its __all__
from lab.precision.policy import match_fp32_modules
from lab.result import RunResult

__all__ = [*gate.__all__, *policy.__all__,
           "after_training", "before_training", "check", "fit_options", "report"]




def check(cfg: RunConfig) -> None:
    """Nothing to refuse before the model exists: every dtype runs (emulated ones carry a "why" tag)."""


def preflight(ctx: TrainContext, model: nn.Module) -> None:
    """Check ``precision.fp32_modules`` against a fresh model, and refuse a dtype the model gate says cannot
    train this model here (fp16 convolutions on CPU: :func:`~lab.precision.gate.model_gate`), before any
    training: :class:`~lab.precision.gate.NotApplicable`, which an ablation shows as "does not apply here"."""
    cfg = ctx.cfg.precision
    if cfg.fp32_modules:
        match_fp32_modules(model, cfg.fp32_modules)
    why = model_gate(model, cfg.dtype, ctx.device.type, cfg.fp32_modules)
    if why:
        raise NotApplicable(f"precision.dtype={cfg.dtype!r} cannot train this model here: {why}")


def before_training(ctx: TrainContext, model: nn.Module) -> tuple[nn.Module, list[StepHook]]:
    """Check ``precision.fp32_modules`` against the model now, not at the first training step."""
    if ctx.cfg.precision.fp32_modules:
        match_fp32_modules(model, ctx.cfg.precision.fp32_modules)
    return model, []


def fit_options(ctx: TrainContext, model: nn.Module, plan: FitPlan) -> None:
    """The run's policy for this fit (unless the caller brought its own, as the ``auto`` probe does)."""
    if plan.policy is not None or not ctx.cfg.precision.enabled:
        return
    policy = policy_for(ctx, model, plan.lr)
    plan.policy = policy

    def record(_stats: Any) -> None:
        ctx.result.details.setdefault("precision", {}).setdefault("phases", {})[plan.phase] = policy.diagnostics()
        untouched = policy.untouched_by_autocast()
        if untouched and plan.phase == "train":
            names = ", ".join(f"{n} ({t})" for n, t in untouched.items())
            ctx.result.why.append(f"{policy.dtype} autocast left {names} in fp32: autocast on {policy.device_type} "
                                  f"has no {policy.dtype} rule for them")

    plan.finished.append(record)


def after_training(ctx: TrainContext, model: nn.Module) -> nn.Module:
    return model


def report(result: RunResult) -> dict[str, Any]:
    """What ran and why: requested and resolved dtype, the gate's verdict, the ``auto`` decision."""
    rec = result.details.get("precision", {})
    train = (rec.get("phases") or {}).get("train", {})
    return {"requested": rec.get("requested", "fp32"), "resolved": rec.get("resolved", "fp32"),
            "native": (rec.get("capability") or {}).get("native"), "auto": (rec.get("auto") or {}).get("why"),
            "skipped_steps": len(train.get("skipped_steps", [])), "forced_fp32": train.get("forced_fp32", {})}
