"""Pruning: masks through ``torch.nn.utils.prune`` (:mod:`.masks`), physical channel removal with Torch-Pruning
(:mod:`.channels`), the cubic gradual schedule (:mod:`.schedule`), and theory beside measured speed
(:mod:`.report`: parameters, non-zeros, bytes, MACs, interleaved latency, "why" tags).

Why report MACs *and* measured time: a mask skips no work on a dense kernel, so unstructured sparsity gives
~1.0x speed however many zeros it holds; only removing channels makes the layers smaller, and even that
gains less than the MACs ratio on small layers.

The family's technique (:class:`Pruning`, see :mod:`lab.technique`): ``preflight`` validates the layer selection
against a fresh model, ``before_training`` installs identity masks and the schedule hook for ``gradual``;
``after_training`` prunes (or finishes the ramp), fine-tunes at ``lr * finetune_lr_factor`` through ``ctx.fit``,
bakes the masks in and records ``result.details["pruning"]``. A workload whose model is not traced as one graph says
so through its ``Workload.prune_scopes`` hook. Notebook: ``notebooks/03_pruning.ipynb``."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.nn.utils import prune as tprune

from lab import measure
from lab.config import PruneConfig, RunConfig
from lab.context import TrainContext
from lab.loop import StepHook
from lab.pruning import channels, masks, schedule
from lab.pruning import portable as portable_
from lab.pruning import report as report_
from lab.pruning.channels import *  # noqa: F403 - the names in its __all__
from lab.pruning.channels import ScopesFn, channel_exclusions, channel_prunable_layers
from lab.pruning.masks import *  # noqa: F403 - the names in its __all__
from lab.pruning.masks import (
    Target,
    attach_mask_refresh,
    excluded_weights,
    make_permanent,
    prunable_weights,
    prune,
    set_sparsity,
)
from lab.pruning.report import *  # noqa: F403 - the names in its __all__
from lab.pruning.report import record
from lab.pruning.schedule import *  # noqa: F403 - the names in its __all__
from lab.pruning.schedule import GradualPruner
from lab.pruning.timed import channels_removed
from lab.registry import FAMILIES
from lab.result import RunResult, section
from lab.technique import Option, Portable, Technique
from lab.timed import TRAIN, Bench, NotTimed, TimedArm

__all__ = [*channels.__all__, *masks.__all__, *report_.__all__, *schedule.__all__, "Pruning", "TECHNIQUE"]


def _batch(tensors: tuple[torch.Tensor, ...], n: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(t[:n].to(device) for t in tensors[:-1])


def _check_model(model: nn.Module, pcfg: PruneConfig, scopes: ScopesFn | None,
                 example: tuple) -> list[Target] | None:
    """Validate the layer selection before any training happens (errors must come early): a named layer
    that matches nothing or cannot be pruned, a weight that cannot carry a mask (tied, or its module never
    runs), a model with nothing left to prune."""
    if pcfg.method == "structured_channels":
        channel_prunable_layers(model, pcfg.layers, scopes, example)
        return None
    return prunable_weights(model, pcfg.layers, example)


def _copy(model: nn.Module, example: tuple) -> nn.Module:
    """deepcopy that also works mid-training: a masked module's ``weight`` is a non-leaf tensor from the
    last training forward, which deepcopy refuses; one no-grad eval forward recomputes it as a plain one."""
    was = model.training
    model.eval()
    with torch.no_grad():
        model(*example)
    model.train(was)
    return copy.deepcopy(model)


def _prune_and_finetune(ctx: TrainContext, model: nn.Module) -> nn.Module:
    """One-shot prune (or finish the gradual ramp), fine-tune through ``ctx.fit``, bake the masks in, and
    record the figures in ``result.details["pruning"]`` with "why" tags where speed falls short of theory."""
    pcfg, device = ctx.cfg.prune, ctx.device
    if not pcfg.enabled:
        return model
    example = _batch(ctx.data.train, ctx.resolved.batch_size, device)
    dense = make_permanent(_copy(model, example))
    metric_name = ctx.workload.metric_name
    info: dict[str, Any] = {"method": pcfg.method, "amount": pcfg.amount, "schedule": pcfg.schedule}
    info["excluded"] = (channel_exclusions(dense, ctx.workload.prune_scopes, example)
                        if pcfg.method == "structured_channels"
                        else excluded_weights(dense, pcfg.layers, example))
    hook = ctx.state.pop("prune.schedule", None)
    if hook is not None:
        set_sparsity(model, pcfg, pcfg.amount, hook.targets)  # land exactly on the target
        info["schedule_history"] = [list(h) for h in hook.history]
    else:
        info["metric_dense"] = ctx.evaluate(model)[metric_name]
        prune(model, pcfg, example_inputs=example, scopes=ctx.workload.prune_scopes)
    if pcfg.method == "structured_channels":  # output widths before -> after, per candidate layer
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            info["metric_pruned_stale_batchnorm"] = ctx.evaluate(model)[metric_name]
            info["batchnorm_recalibrated"] = channels.recalibrate_batchnorm(
                model, ctx.data.train, ctx.resolved.batch_size, device)
        mods = dict(model.named_modules())
        info["channels"] = {n: [int(m.weight.shape[0]), int(mods[n].weight.shape[0])] for n, m in
                            channel_prunable_layers(dense, pcfg.layers, ctx.workload.prune_scopes).items() if n in mods}
    info["metric_pruned"] = ctx.evaluate(model)[metric_name]
    if pcfg.finetune_epochs:
        stats = ctx.fit(model, epochs=pcfg.finetune_epochs, lr=ctx.resolved.lr * pcfg.finetune_lr_factor,
                        phase="finetune")
        info["finetune"] = {"epochs": pcfg.finetune_epochs, "steps": stats.steps, "time_s": stats.time_s,
                            "lr": ctx.resolved.lr * pcfg.finetune_lr_factor,
                            "median_step_ms": measure.median(stats.step_times_ms["total"][ctx.cfg.warmup_steps:]
                                                             or stats.step_times_ms["total"]),
                            "losses": stats.losses}
        info["metric_finetuned"] = ctx.evaluate(model)[metric_name]
    make_permanent(model)
    record(ctx, dense, model, example, info)
    return model


class Pruning(Technique):
    """Masks or channel removal after training (or a gradual ramp during it), then a fine-tune."""

    name = "pruning"

    def timed(self, option: Option, bench: Bench, arm: TimedArm) -> None:
        """The arm runs a copy of the rung's model with the option's share of channels removed
        (:func:`lab.pruning.timed.channels_removed`). Masks are not timed: they change no kernel's work."""
        o = option.overrides
        if o.get("prune.method") != "structured_channels":
            raise NotTimed(f"{option.name} masks weights in place: dense kernels do the same work, so the map "
                           "times channel pruning only")
        if arm.derived:
            raise NotTimed(f"{option.name} prunes the rung's own model, not one already {arm.derived[-1]}")
        model, note = channels_removed(bench, float(o["prune.amount"]))
        arm.notes.append(note)
        arm.derive(model if arm.axis == TRAIN else model.eval(), "pruned")

    def preflight(self, ctx: TrainContext, model: nn.Module) -> None:
        """Check ``prune.layers`` (and what the method can prune) against a fresh model, before any training."""
        if ctx.cfg.prune.enabled:
            _check_model(model, ctx.cfg.prune, ctx.workload.prune_scopes, _batch(ctx.data.train, 2, ctx.device))

    def before_training(self, ctx: TrainContext, model: nn.Module) -> tuple[nn.Module, list[StepHook]]:
        """For ``gradual``, put identity masks on the targets (so the optimizer holds ``weight_orig`` from
        step 0) and return the cubic-schedule step hook, sized by :meth:`TrainContext.total_steps`."""
        pcfg = ctx.cfg.prune
        if not pcfg.enabled or pcfg.schedule != "gradual" or pcfg.method == "structured_channels":
            return model, []
        targets = prunable_weights(model, pcfg.layers, _batch(ctx.data.train, 2, ctx.device))
        for _, m, w in targets:
            tprune.identity(m, w)
        attach_mask_refresh(model)
        hook = GradualPruner(pcfg, ctx.total_steps(), targets)
        ctx.state["prune.schedule"] = hook  # after_training finishes the ramp
        return model, [hook]

    def after_training(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        return _prune_and_finetune(ctx, model)

    def replaces_model(self, cfg: RunConfig) -> bool:
        return cfg.prune.enabled

    def portable(self, cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
        """Masks or Torch-Pruning channel removal, then the fine-tune, written out (:mod:`lab.pruning.portable`)."""
        return portable_.portable(cfg, run)

    def report(self, result: RunResult) -> dict[str, Any]:
        """Sparsity, the MACs ratio theory promises and the inference speedup measured."""
        rec = section(result, self.name)
        return {"method": rec.get("method", "none"), "amount": rec.get("amount", 0.0),
                "sparsity_prunable": rec.get("sparsity_prunable"), "macs_ratio": rec.get("macs_ratio"),
                "inference_speedup": (rec.get("inference") or {}).get("speedup")}


TECHNIQUE = FAMILIES.register(Pruning.name, Pruning(), overwrite=True)  # overwrite: reload stays idempotent
from lab.pruning import options  # noqa: E402, F401 - the family's option strings, registered with it
