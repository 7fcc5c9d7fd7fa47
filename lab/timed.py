"""A timed arm: one option applied to one model for a training step or an inference call, by its own family.

Why here, below the families: the crossover map times dozens of (workload x rung x option) cells, each a step or
a call on a fixed batch, and every option must be applied the way a run applies it. So a family says how its
option changes an arm (:meth:`lab.technique.Technique.timed`: the precision policy, a fused optimizer, a
compiled forward, a thinner model, an int8 model, a loader's batches), and the arm is timed through the one
training step of the lab (:func:`lab.loop.train_step`) or one no-grad call. A stack of options (channels, then
int8) is each family applied in turn to the same arm, in :data:`lab.registry.FAMILY_ORDER`. The map
(:mod:`lab.crossover`) keeps only what is its own: which options it times on which axis, and the decisions
(``amp_auto``, ``int8_auto``) read from the arms' samples afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from lab.loop import PLAIN, StepPolicy, make_optimizer, train_step
from lab.workloads import Workload

#: A timed callable: one training step or one inference call.
Arm = Callable[[], Any]
TRAIN, INFER = "train_step", "inference"


class NotTimed(Exception):
    """An option that cannot change this arm here (a family without a timed arm for it, a precision refused by
    the run's own gate, a model with no channel to remove): the map's row says why, it is not an error."""


@dataclass
class Bench:
    """One rung's fixture: the model (train mode), a fixed batch, the workload and its learning rate."""

    workload: Workload
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    target: torch.Tensor
    lr: float
    train_rows: tuple[torch.Tensor, ...]  # a few batches of training rows for the loaders and calibration
    notes: dict[str, str] = field(default_factory=dict)  # option -> what applying it did, or why it was skipped
    #: a family's models built once per rung (an int8 model: PT2E exports, calibrates and compiles), by its key
    built: dict[tuple[str, ...], Any] = field(default_factory=dict)
    #: an ``auto`` option -> what it decided (``int8_auto``: the flow probe's record)
    choices: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.target.shape[0])

    @property
    def device(self) -> torch.device:
        return self.inputs[0].device


@dataclass
class TimedArm:
    """What one arm runs; families change it in turn (:meth:`lab.technique.Technique.timed`).

    ``model``: the model the arm trains (train mode) or calls (eval mode); ``derived``: the transforms applied
    to it so far (``()`` while it is the rung's own model, ``("pruned",)`` after channel pruning), the key a
    family caches a model it builds from it under. Training: ``policy`` (autocast, backward, optimizer step),
    ``fused`` (a fused optimizer), ``optimizer`` (another optimizer than Adam: low-bit state), ``forward`` (a
    compiled forward), ``batches`` (a loader's batches instead of the fixed one). Inference: ``autocast`` around
    the call. ``own_baseline``: a family whose arm changes what the step is fed (a loader) times it against the
    same step fed the plain way, not against the fixed batch."""

    axis: str
    model: nn.Module
    derived: tuple[str, ...] = ()
    policy: StepPolicy = PLAIN
    fused: bool = False
    #: ``(parameters, lr) -> optimizer`` instead of the step's Adam (low-bit Adam state)
    optimizer: Callable[[list[nn.Parameter], float], torch.optim.Optimizer] | None = None
    forward: Callable[..., torch.Tensor] | None = None
    batches: Callable[[], tuple[torch.Tensor, ...]] | None = None
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    own_baseline: TimedArm | None = None
    micro_batches: int = 1  # each batch run as this many micro-batches, gradients accumulated (memory family)
    notes: list[str] = field(default_factory=list)  # what each family did to it, in order (the row's note)

    def derive(self, model: nn.Module, how: str) -> None:
        """The arm now runs ``model``, made from the previous one by ``how``."""
        self.model, self.derived = model, (*self.derived, how)

    def but(self, **changes: Any) -> TimedArm:
        """A copy with ``changes`` (a family's own baseline: the same arm fed another way)."""
        return replace(self, **changes)


def base_arm(bench: Bench, axis: str) -> TimedArm:
    """The arm before any option: the rung's model (training), or an eval-mode copy of it (inference)."""
    return TimedArm(axis, bench.model if axis == TRAIN else copy.deepcopy(bench.model).eval())


def timed_train(bench: Bench, arm: TimedArm) -> Arm:
    """One training step as a run takes it (:func:`lab.loop.train_step`: forward + loss in the policy's
    autocast, the policy's backward and optimizer step, gradients cleared), on the fixed batch or on
    ``arm.batches()``; the optimizer is Adam at the rung's lr (fused when ``arm.fused``), or ``arm.optimizer``'s."""
    wl, model = bench.workload, arm.model
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = arm.optimizer(params, bench.lr) if arm.optimizer is not None else \
        make_optimizer("adam", params, bench.lr, fused=arm.fused)
    fixed = (*bench.inputs, bench.target)
    feed: Iterator[tuple[torch.Tensor, ...]] = itertools.repeat(fixed) if arm.batches is None else \
        iter(arm.batches, None)

    def step() -> None:
        train_step(model, optimizer, wl.loss, feed, bench.device, policy=arm.policy, forward=arm.forward,
                   micro_batches=arm.micro_batches)

    return step


def timed_inference(bench: Bench, arm: TimedArm) -> Arm:
    """One no-grad forward of the fixed batch in eval mode, under the arm's autocast."""
    model = arm.model.eval()

    @torch.no_grad()
    def call() -> None:
        with arm.autocast():
            model(*bench.inputs)

    return call


def timed(bench: Bench, arm: TimedArm) -> Arm:
    """The arm's callable on its axis."""
    return timed_train(bench, arm) if arm.axis == TRAIN else timed_inference(bench, arm)


__all__ = ["INFER", "TRAIN", "Arm", "Bench", "NotTimed", "TimedArm", "base_arm", "timed", "timed_inference",
           "timed_train"]
