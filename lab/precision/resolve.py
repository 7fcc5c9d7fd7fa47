"""Resolve ``precision.dtype`` for a fit: the configured dtype, or ``auto`` decided by one of its two probes.

Kept apart from :mod:`lab.precision.auto` (the rule and the copy probe) and :mod:`lab.precision.inrun` (the probe
on the run's own steps) so that each builds on the other without a circle: this module picks which one decides.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from lab.context import TrainContext
from lab.precision.auto import auto_candidates, resolve_auto
from lab.precision.gate import capability
from lab.precision.inrun import inrun_policy
from lab.precision.policy import PrecisionPolicy


def policy_for(ctx: TrainContext, model: nn.Module, lr: float, *, phase: str = "") -> Any:
    """The policy of ``ctx``'s run; resolves ``auto`` (by measuring) and records the gate's verdict and
    "why" tags in the result the first time it is called (``ctx.state["precision.dtype"]`` remembers it).
    ``details["precision"]["auto"]``: the rule, the plan, the per-round samples, each candidate's speedup and
    verdict, the choice and why, and what the probe cost (``probe_s``, its share of the run's estimated time).

    ``phase="train"`` (the main training fit of a single-process run, not checkpointed): ``auto`` is decided on
    the run's own first steps (:mod:`lab.precision.inrun`), and what is returned is that probe's step policy,
    which becomes the chosen dtype's once it has decided; a run too short to repay that probe is not probed
    (:mod:`lab.precision.unprobed`: a stored probe of the model, the machine card, or fp32). Elsewhere the copy
    probe decides before training."""
    cfg, dev = ctx.cfg.precision, ctx.device
    if "precision.dtype" not in ctx.state:
        rec = ctx.result.details.setdefault("precision", {})
        rec["requested"] = cfg.dtype
        choice = cfg.dtype
        if cfg.dtype == "auto":
            arms, caps, gated, not_tried = auto_candidates(ctx, model)
            if phase == "train" and _in_run_allowed(ctx) and len(arms) > 1:
                probing, declined = inrun_policy(ctx, arms, caps, gated, not_tried, _resolved)
                if probing is not None:
                    return probing
                # too short to repay a probe on its own steps, so (at 3 %) for the copy probe too: why is the in-run's
                choice, rec["auto"] = resolve_auto(ctx, model, lr, short=declined)
            else:
                choice, rec["auto"] = resolve_auto(ctx, model, lr)
            ctx.result.why.append(rec["auto"]["why"])
        _resolved(ctx, choice)
    return PrecisionPolicy(dtype=ctx.state["precision.dtype"], device_type=dev.type, fp32_modules=cfg.fp32_modules)


def _resolved(ctx: TrainContext, choice: str) -> None:
    """Record the dtype the run trains in (and the gate's tag for it) and remember it for later fits."""
    cap = capability(choice, ctx.device)
    ctx.result.details.setdefault("precision", {}).update(resolved=choice, capability=dataclasses.asdict(cap))
    if cap.why_tag():
        ctx.result.why.append(cap.why_tag())
    ctx.state["precision.dtype"] = choice


def _in_run_allowed(ctx: TrainContext) -> bool:
    """The in-run probe needs one process (every DDP rank must train the same dtype) and a run that starts from
    step 0 and is not checkpointed mid-probe."""
    cfg = ctx.cfg
    return not cfg.ddp.enabled and cfg.checkpoint_every is None and cfg.resume is None


__all__ = ["policy_for"]
