"""The pruning family's timed arm: a copy of the rung's model with channels removed (Torch-Pruning).

The crossover map times channel pruning as the step or call of the thinner model (:mod:`lab.timed`); masks are
not timed there (a masked weight is still multiplied: dense kernels do the same work).
"""

from __future__ import annotations

import copy
import warnings

from torch import nn

from lab.measure import count_macs
from lab.pruning.channels import prune_channels
from lab.timed import Bench


def channels_removed(bench: Bench, amount: float) -> tuple[nn.Module, str]:
    """A copy of the rung's model with ``amount`` of each prunable layer's output channels removed, and a note
    saying how many times fewer MACs it does (counted on <= 16 rows of the fixed batch). A model with nothing to
    remove (an LSTM's gates) is a ``ValueError``: the row says so."""
    model = copy.deepcopy(bench.model)
    with warnings.catch_warnings():  # Torch-Pruning's notice about attention's in_proj, once per model
        warnings.filterwarnings("ignore", message=".*Torch-Pruning will prune the last non-singleton")
        changed = prune_channels(model, amount, example_inputs=bench.inputs, scopes=bench.workload.prune_scopes)
    if not any(after < before for before, after in changed.values()):
        raise ValueError("no channel could be removed (no prunable Linear/Conv output: e.g. an LSTM's gates)")
    rows = tuple(t[: min(16, bench.batch_size)] for t in bench.inputs)
    ratio = count_macs(bench.model, rows) / max(1, count_macs(model, rows))
    return model, f"{amount:.0%} of the channels removed: {ratio:.2f}x fewer MACs"


__all__ = ["channels_removed"]
