"""Low-bit optimizer state: Adam's two moments kept in 8 or 4 bits (torchao's ``AdamW8bit`` / ``AdamW4bit``).

Why the moments: Adam keeps two fp32 tensors per parameter, twice the parameters' own bytes, and a model that
fits in memory for its weights and gradients may not fit with them. torchao quantizes each moment block-wise
(blocks of 256 values, one fp32 absmax scale each, codes through a 256- or 16-entry map: Dettmers et al. 2022),
so the state is about 4x (8-bit) or 8x (4-bit) smaller. Parameters under 4,096 elements (biases, norms) keep
fp32 moments: a small model's saving is less (``details["memory"]``). Weight decay is 0, so the update is
Adam's, the lab's default optimizer, and a run differs from the fp32 one by the state's rounding only.

The one-off cost: torchao compiles its update per parameter shape on the first step (``torch.compile``;
~10-30 s on 2 CPU cores, less from Inductor's on-disk cache), inside the run's first step, which the warm-up
excludes from the per-step figures; ``details["memory"]["optimizer_compile_s"]`` records it and the run's
one-off costs count it (:mod:`lab.result.timeline`).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable

import torch
from torch import nn

#: ``memory.optimizer_state`` -> the torchao optimizer that keeps it.
LOW_BIT: dict[str, str] = {"int8": "AdamW8bit", "int4": "AdamW4bit"}
#: Bits per moment value of each low-bit state (the codes; the scales add 4 bytes per 256 values).
BITS = {"int8": 8, "int4": 4}

OptimizerFactory = Callable[[list[nn.Parameter], float], torch.optim.Optimizer]


def low_bit_class(state: str) -> type[torch.optim.Optimizer]:
    """torchao's optimizer class for ``state`` (``int8`` / ``int4``); a ``ValueError`` naming what is missing."""
    if state not in LOW_BIT:
        raise ValueError(f"memory.optimizer_state={state!r} is invalid: allowed: {', '.join(LOW_BIT)} (fp32: "
                         "torch's Adam)")
    if importlib.util.find_spec("torchao") is None:
        raise ValueError(f"memory.optimizer_state={state!r} needs torchao (pip install torchao): its "
                         f"{LOW_BIT[state]} keeps the low-bit state")
    return getattr(importlib.import_module("torchao.optim"), LOW_BIT[state])


def low_bit_adam(state: str) -> OptimizerFactory:
    """``(parameters, lr) -> optimizer``: torchao's low-bit AdamW at weight decay 0 (Adam's update, torch's
    default betas and eps), for :attr:`lab.technique.FitPlan.optimizer` and a timed arm's ``optimizer``."""
    cls = low_bit_class(state)

    def make(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return cls(params, lr=lr, weight_decay=0.0)

    make.__qualname__ = make.__name__ = f"low_bit_adam_{state}"
    return make


__all__ = ["BITS", "LOW_BIT", "OptimizerFactory", "low_bit_adam", "low_bit_class"]
