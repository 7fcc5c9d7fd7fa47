"""Gradual pruning: Zhu & Gupta's cubic sparsity schedule, applied as a step hook of the one loop."""

from __future__ import annotations

from torch import nn

from lab.config import PruneConfig
from lab.pruning.masks import Target, set_sparsity


def cubic_sparsity(step: int, final: float, start_step: int, end_step: int, initial: float = 0.0) -> float:
    """Zhu & Gupta (2017): s_t = s_f + (s_i - s_f) (1 - (t - t0) / (t_end - t0))^3, clamped to [t0, t_end].
    Prunes fast while the network is redundant and slowly as the target approaches."""
    if end_step <= start_step:
        return final if step >= end_step else initial
    p = min(max((step - start_step) / (end_step - start_step), 0.0), 1.0)
    return final + (initial - final) * (1.0 - p) ** 3


class GradualPruner:
    """A step hook ``hook(step, model)`` that raises the masks' sparsity along :func:`cubic_sparsity`
    every ``frequency_steps`` steps between ``start_step`` and ``end_step``. ``history`` records
    ``(step, sparsity)`` at each update."""

    def __init__(self, pcfg: PruneConfig, total_steps: int, targets: list[Target]) -> None:
        self.pcfg, self.targets = pcfg, targets
        self.start_step = int(pcfg.start_fraction * total_steps)
        self.end_step = max(self.start_step, int(pcfg.end_fraction * total_steps) - 1)
        self.history: list[tuple[int, float]] = []

    def __call__(self, step: int, model: nn.Module) -> None:
        if step < self.start_step or step > self.end_step:
            return
        if (step - self.start_step) % self.pcfg.frequency_steps and step != self.end_step:
            return
        s = cubic_sparsity(step + 1, self.pcfg.amount, self.start_step, self.end_step + 1)
        set_sparsity(model, self.pcfg, s, self.targets)
        self.history.append((step, s))

__all__ = [
    "cubic_sparsity", "GradualPruner",
]
