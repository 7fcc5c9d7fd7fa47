"""Activation checkpointing per block: each block's forward keeps only its inputs, and backward runs it again.

Why per block, and why on the block itself: a training step keeps every activation its backward needs until that
backward runs, so a deep model's saved activations grow with depth; checkpointing a block keeps its inputs and
recomputes its inside when backward reaches it (``torch.utils.checkpoint``, non-reentrant: the form PyTorch
recommends, with keyword arguments, any inputs and nested autograd). The block is found by the workload
(:meth:`lab.workloads.Workload.model_blocks`), never by this module, and wrapped *in place*: its ``forward``
becomes an instance attribute (:class:`CheckpointedForward`), so module names, ``state_dict`` keys, pruning's
layer names and a deep copy stay those of the plain model, and :func:`restore_blocks` hands the plain model on.

What it keeps exact: the recompute draws the same dropout masks (``preserve_rng_state``) under the same autocast
state (torch restores it), and BatchNorm's running statistics are updated once per step, not twice (the recompute
runs them at momentum 0: the same batch statistics, no second update), so losses,
gradients and the trained model equal the plain run's up to float rounding. Outside autograd (``no_grad``:
evaluation, latency) a block runs plainly.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lab.measure.memory import SavedTensorBytes


@contextlib.contextmanager
def _running_stats_frozen(norms: Sequence[nn.modules.batchnorm._BatchNorm]) -> Iterator[None]:
    """BatchNorm layers normalise by the batch but leave their running statistics as they are (the recompute):
    momentum 0 makes the update ``running * 1 + batch * 0`` and the batch count is put back. Not
    ``track_running_stats=False``: the layer would then save two tensors fewer for backward, and the checkpoint
    matches the recomputed saved tensors to the original ones by their order."""
    before = [(bn.momentum, bn.num_batches_tracked.clone() if bn.num_batches_tracked is not None else None)
              for bn in norms]
    for bn in norms:
        bn.momentum = 0.0
    try:
        yield
    finally:
        with torch.no_grad():
            for bn, (momentum, count) in zip(norms, before, strict=True):
                bn.momentum = momentum
                if count is not None:
                    bn.num_batches_tracked.copy_(count)


class CheckpointedForward:
    """A block's ``forward`` that checkpoints it: installed as the block's instance attribute ``forward`` (so
    ``block(...)``, its hooks and a deep copy keep working); ``plain`` is the forward it replaced."""

    def __init__(self, block: nn.Module) -> None:
        self.block = block
        self.plain = block.forward

    def _contexts(self) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        norms = [m for m in self.block.modules()
                 if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
        return contextlib.nullcontext(), _running_stats_frozen(norms)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.plain(*args, **kwargs)
        counting = SavedTensorBytes.active()
        if counting is not None:  # the inputs the checkpoint keeps for its recompute, not saved through the hooks
            counting.note(list(args), list(kwargs.values()))
        # Compiled, the recompute is AOTAutograd's (the buffer updates stay in the forward graph, once) and a
        # context_fn other than the default is not traced: only eager recomputes BatchNorm at momentum 0.
        has_norms = not torch.compiler.is_compiling() and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in self.block.modules())
        extra = {"context_fn": self._contexts} if has_norms else {}
        return checkpoint(self.plain, *args, use_reentrant=False, **extra, **kwargs)


def checkpointed(block: nn.Module) -> bool:
    return isinstance(block.__dict__.get("forward"), CheckpointedForward)


def checkpoint_blocks(model: nn.Module, blocks: Sequence[nn.Module]) -> list[str]:
    """Checkpoint each of ``blocks`` (modules of ``model``) in place; returns their names in ``model``."""
    names = {id(m): n for n, m in model.named_modules()}
    out = []
    for block in blocks:
        if id(block) not in names:
            raise ValueError(f"{type(block).__name__} is not a module of the model: a workload's blocks must be "
                             "modules of the model it is given")
        if not checkpointed(block):
            block.forward = CheckpointedForward(block)
        out.append(names[id(block)])
    return out


def restore_blocks(model: nn.Module) -> int:
    """Undo :func:`checkpoint_blocks` on every block of ``model``; returns how many were checkpointed."""
    n = 0
    for m in model.modules():
        wrapper = m.__dict__.get("forward")
        if isinstance(wrapper, CheckpointedForward):
            del m.forward
            plain = wrapper.plain
            if getattr(plain, "__self__", None) is not m or getattr(plain, "__func__", None) is not type(m).forward:
                m.forward = plain  # a forward another wrapper had installed before
            n += 1
    return n


def checkpointed_copy(model: nn.Module, blocks_of: Any) -> tuple[nn.Module, list[str]]:
    """A deep copy of ``model`` with its blocks (``blocks_of(copy)``) checkpointed, and their names; the
    crossover map's arm and the doctor's rate time this against the model itself."""
    twin = copy.deepcopy(model)
    blocks = blocks_of(twin)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no blocks to checkpoint")
    return twin, checkpoint_blocks(twin, blocks)


__all__ = ["CheckpointedForward", "checkpoint_blocks", "checkpointed", "checkpointed_copy", "restore_blocks"]
