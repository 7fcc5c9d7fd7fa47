"""Model transforms around training: where pruning and quantization plug into the one loop.

Why a separate door: pruning and quantization take a model and return a model (DESIGN.md §3), but some
of them act *during* training too (a gradual pruning schedule steps with the optimizer; QAT fine-tunes
with fake-quant). ``before_training`` may wrap the model and return per-step hooks; ``after_training``
applies one-shot transforms and any fine-tuning through ``ctx.fit`` (the same measured loop). Order:
prune, then quantize — int8 of a pruned model, never pruning of an int8 one.

Each family's module is imported only when the config switches it on, so ``import lab`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from lab.train import StepHook, TrainContext


def before_training(ctx: TrainContext, model: nn.Module) -> tuple[nn.Module, list[StepHook]]:
    """Prepare ``model`` for training; returns it with the step hooks the loop must call."""
    hooks: list[StepHook] = []
    if ctx.cfg.prune.enabled:
        from lab import pruning

        model, more = pruning.before_training(ctx, model)
        hooks.extend(more)
    if ctx.cfg.quant.enabled:
        from lab import quantization

        model, more = quantization.before_training(ctx, model)
        hooks.extend(more)
    return model, hooks


def after_training(ctx: TrainContext, model: nn.Module) -> nn.Module:
    """Apply the post-training transforms (prune + fine-tune, then quantize) and return the final model."""
    if ctx.cfg.prune.enabled:
        from lab import pruning

        model = pruning.after_training(ctx, model)
    if ctx.cfg.quant.enabled:
        from lab import quantization

        model = quantization.after_training(ctx, model)
    return model
