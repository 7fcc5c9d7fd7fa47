"""Mixed precision for the one training loop: autocast policy, capability gate, ``auto``, fp32 islands.

The family's technique (:class:`Precision`, see :mod:`lab.technique`): ``fit_options`` hands every fit of a run
the :class:`PrecisionPolicy` its config asks for (``auto`` is resolved once, by measuring the run's own step:
:mod:`lab.precision.auto`) and records the policy's diagnostics per phase in ``result.details["precision"]``;
``preflight`` checks the ``fp32_modules``
names and the model gate against a fresh model before any training. Taught in ``notebooks/02_mixed_precision.ipynb``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lab.config import RunConfig
from lab.context import TrainContext
from lab.precision import auto, gate, policy, resolve
from lab.precision import portable as portable_
from lab.precision.auto import *  # noqa: F403 - the names in its __all__
from lab.precision.gate import *  # noqa: F403 - the names in its __all__
from lab.precision.gate import NotApplicable, capability, model_gate
from lab.precision.policy import *  # noqa: F403 - the names in its __all__
from lab.precision.policy import PrecisionPolicy, match_fp32_modules
from lab.precision.resolve import policy_for
from lab.registry import FAMILIES
from lab.result import RunResult
from lab.technique import FitPlan, Option, Portable, Technique
from lab.timed import TRAIN, Bench, NotTimed, TimedArm

__all__ = [*auto.__all__, *gate.__all__, *policy.__all__, *resolve.__all__, "Precision", "TECHNIQUE"]


class Precision(Technique):
    """Autocast in the loop: the dtype the config asks for, ``auto`` resolved by measuring, fp32 islands."""

    name = "precision"

    def preflight(self, ctx: TrainContext, model: nn.Module) -> None:
        """Check ``precision.fp32_modules`` against a fresh model, and refuse a dtype the model gate says cannot
        train this model here (fp16 convolutions on CPU: :func:`~lab.precision.gate.model_gate`), before any
        training: :class:`~lab.precision.gate.NotApplicable`, which an ablation shows as "does not apply here".
        Nothing is refused before the model exists: every dtype runs (emulated ones carry a "why" tag)."""
        cfg = ctx.cfg.precision
        if cfg.fp32_modules:
            match_fp32_modules(model, cfg.fp32_modules)
        why = model_gate(model, cfg.dtype, ctx.device.type, cfg.fp32_modules)
        if why:
            raise NotApplicable(f"precision.dtype={cfg.dtype!r} cannot train this model here: {why}")

    def fit_options(self, ctx: TrainContext, model: nn.Module, plan: FitPlan) -> None:
        """The run's policy for this fit (unless the caller brought its own, as the ``auto`` probe does)."""
        if plan.policy is not None or not ctx.cfg.precision.enabled:
            return
        policy = policy_for(ctx, model, plan.lr, phase="" if plan.probe else plan.phase)
        plan.policy = policy

        def record(_stats: Any) -> None:
            phases = ctx.result.details.setdefault("precision", {}).setdefault("phases", {})
            phases[plan.phase] = policy.diagnostics()
            untouched = policy.untouched_by_autocast()
            if untouched and plan.phase == "train":
                names = ", ".join(f"{n} ({t})" for n, t in untouched.items())
                ctx.result.why.append(f"{policy.dtype} autocast left {names} in fp32: autocast on "
                                      f"{policy.device_type} has no {policy.dtype} rule for them")

        plan.finished.append(record)

    def portable(self, cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
        """Autocast (+ GradScaler for fp16) written out; ``auto`` as the dtype a stored run chose
        (:mod:`lab.precision.portable`)."""
        return portable_.portable(cfg, run)

    def timed(self, option: Option, bench: Bench, arm: TimedArm) -> None:
        """Training: the run's policy for the dtype (autocast around forward + loss, GradScaler for fp16), refused
        where the run's own gate refuses it (fp16 convolution backward has no fast CPU kernel); inference: the
        call under that autocast. An emulated dtype is timed anyway and says so. ``auto`` is no arm: the map
        decides it from the bf16 / fp16 arms' samples."""
        dtype = option.overrides.get("precision.dtype", "fp32")
        if dtype not in ("bf16", "fp16"):
            raise NotTimed(f"{option.name} is decided from the bf16 / fp16 arms, not timed itself")
        device_type = bench.device.type
        if arm.axis == TRAIN:
            refused = model_gate(arm.model, dtype, device_type)
            if refused:
                raise NotTimed(f"does not apply here: {refused}")
        cap = capability(dtype, "cpu" if device_type == "cpu" else bench.device)
        if not cap.native:
            arm.notes.append(f"emulated here ({cap.reason}); measured anyway")
        policy = PrecisionPolicy(dtype=dtype)
        if arm.axis == TRAIN:
            arm.policy = policy
        else:
            arm.autocast = policy.autocast

    def report(self, result: RunResult) -> dict[str, Any]:
        """What ran and why: requested and resolved dtype, the gate's verdict, the ``auto`` decision."""
        rec = result.details.get("precision", {})
        train = (rec.get("phases") or {}).get("train", {})
        return {"requested": rec.get("requested", "fp32"), "resolved": rec.get("resolved", "fp32"),
                "native": (rec.get("capability") or {}).get("native"), "auto": (rec.get("auto") or {}).get("why"),
                "skipped_steps": len(train.get("skipped_steps", [])), "forced_fp32": train.get("forced_fp32", {})}


TECHNIQUE = FAMILIES.register(Precision.name, Precision(), overwrite=True)  # overwrite: reload stays idempotent
from lab.precision import options  # noqa: E402, F401 - the family's option strings, registered with it
