"""The pruning family's option strings. Masks and channels are named apart: ``prune50`` zeroes half the weights
in place (L1 masks: dense kernels do the same work, so only the stored size can change) and
``prune_channels50`` removes half the output channels (Torch-Pruning: the layers get thinner, so the
step can get faster)."""

from __future__ import annotations

from lab.technique import AFTER_TRAINING, Option, register_options


def masks(amount: float) -> Option:
    """``prune<N>``: L1 magnitude masks over ``amount`` of each layer's weights, 1 fine-tune epoch."""
    return Option(f"prune{round(amount * 100)}", {"prune.method": "l1_unstructured", "prune.amount": float(amount),
                                                  "prune.finetune_epochs": 1},
                  "pruning", f"L1 magnitude masks, {amount:.0%} of weights, 1 fine-tune epoch", axes=AFTER_TRAINING)


register_options(
    masks(0.3), masks(0.5), masks(0.7),
    Option("prune_channels50", {"prune.method": "structured_channels", "prune.amount": 0.5,
                                "prune.finetune_epochs": 1}, "pruning",
           "remove 50 % of output channels (Torch-Pruning), 1 fine-tune epoch", axes=AFTER_TRAINING),
)
