"""Pruning as plain PyTorch (``python -m lab recipe``, :mod:`lab.portable`): after the main training, what
:func:`lab.pruning._prune_and_finetune` does, written out. Masks go through ``torch.nn.utils.prune`` (``weight``
becomes ``weight_orig * weight_mask``, so a pruned weight gets a zero gradient and stays 0 through the fine-tune),
then ``prune.remove`` bakes the zeros in; channels go through Torch-Pruning (``MetaPruner``, L``norm`` magnitude,
the output layer kept), BatchNorm statistics re-estimated, then the fine-tune at ``lr * finetune_lr_factor`` with
the same ``fit`` as training.

Left to the lab (named in the script's header): its exclusions for other layer kinds (LSTM / GRU / attention
masks, tied weights, Transformer residual writers, attention heads removed whole: :mod:`lab.pruning.masks`,
:mod:`lab.pruning.channels`); the script prunes the Linear and convolution layers, which is all of a plain
Conv / Linear model. The gradual schedule and ``prune.layers`` are not written out yet (refused).
"""

from __future__ import annotations

from lab.config import RunConfig
from lab.result import RunResult
from lab.technique import NotPortable, Portable, not_written_out

RECALIBRATE_BATCHNORM = '''\
def recalibrate_batchnorm(model, loader, device, max_batches=16):
    """Re-estimate every BatchNorm's running statistics after channels were removed: the stored ones describe
    the dense model's activations. A cumulative average over up to `max_batches` batches, without gradients."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    momenta = [m.momentum for m in bns]
    model.eval()
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the batches seen
        m.train()
    with torch.no_grad():
        for batch in itertools.islice(loader, max_batches):
            model(*(t.to(device) for t in batch[:-1]))
    for m, momentum in zip(bns, momenta, strict=True):
        m.momentum = momentum
    model.train()'''

MASK_CALLS = {"l1_unstructured": "prune.l1_unstructured(module, name, amount={amount})",
              "random_unstructured": "prune.random_unstructured(module, name, amount={amount})"}
NOT_WRITTEN = ("the lab also masks LSTM / GRU / attention weights and leaves tied or never-run weights out "
               "(lab/pruning/masks.py); this file masks Linear and convolution weights")
NOT_WRITTEN_CHANNELS = ("the lab also keeps Transformer residual writers, tied layers and unknown attention layouts "
                        "at full width and removes known attention heads whole (lab/pruning/channels.py); this file "
                        "prunes Linear and Conv2d channels, the output layer kept")


def _finetune(pc) -> tuple[str, ...]:  # noqa: ANN001 - a PruneConfig
    if not pc.finetune_epochs:
        return ()
    lr = "lr" if pc.finetune_lr_factor == 1.0 else f"lr * {pc.finetune_lr_factor!r}"
    return (f"fit(model, loader, loss_fn, epochs={pc.finetune_epochs}, lr={lr}, device=device, phase=\"finetune\")",)


def portable(cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
    """Masks (``torch.nn.utils.prune``) or channel removal (Torch-Pruning), then the fine-tune."""
    pc = cfg.prune
    if not pc.enabled:
        return None
    if pc.schedule == "gradual":
        raise not_written_out("prune.schedule='gradual'", "the cubic schedule (masks updated every "
                              f"{pc.frequency_steps} steps during training)")
    if pc.layers:
        raise NotPortable(f"prune.layers={list(pc.layers)!r}: a layer selection is not written out by the recipe "
                          "yet (it prunes every Linear / convolution layer)")
    tune = f", then {pc.finetune_epochs} fine-tune epoch{'s' if pc.finetune_epochs != 1 else ''} at lr x " \
           f"{pc.finetune_lr_factor:g}" if pc.finetune_epochs else ", no fine-tune"
    if pc.method == "structured_channels":
        return Portable(
            comment=f"remove {pc.amount:.0%} of each layer's output channels with Torch-Pruning (the layers get "
                    f"thinner){tune}",
            imports=("import itertools", "import torch_pruning as tp"), requires=("torch-pruning",),
            helpers=(RECALIBRATE_BATCHNORM,),
            after_training=(
                "# channels: each layer loses its weakest outputs and every reader loses those inputs",
                "example = tuple(t.to(device) for t in next(iter(loader))[:-1])  # traces the channel dependencies",
                "keep = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))][-1:]  # output layer",
                "keep += [m for m in model.modules()  # layers Torch-Pruning does not slice here",
                "         if isinstance(m, (nn.RNNBase, nn.Embedding, nn.EmbeddingBag, nn.MultiheadAttention))]",
                "model.eval()",
                f"tp.pruner.MetaPruner(model, example, importance=tp.importance.MagnitudeImportance(p={pc.norm}), "
                f"pruning_ratio={pc.amount!r},",
                "                     ignored_layers=keep, root_module_types=[nn.Conv2d, nn.Linear]).step()",
                "model.train()",
                "recalibrate_batchnorm(model, loader, device)  # a no-op without BatchNorm",
                *_finetune(pc)),
            notes=(NOT_WRITTEN_CHANNELS,))
    what = "global" if pc.method == "global_unstructured" else "per layer"
    kind = "random" if pc.method == "random_unstructured" else "L1 magnitude"
    if pc.method == "global_unstructured":
        mask = ("prune.global_unstructured(masked, pruning_method=prune.L1Unstructured, "
                f"amount={pc.amount!r})  # one threshold over all of them",)
    else:
        mask = ("for module, name in masked:",
                f"    {MASK_CALLS[pc.method].format(amount=repr(pc.amount))}  # weight = weight_orig * weight_mask")
    return Portable(
        comment=f"{kind} masks over {pc.amount:.0%} of the weights ({what}){tune}; dense kernels do the same work, "
                "so the zeros buy size (sparse storage), not speed",
        imports=("from torch.nn.utils import prune",),
        after_training=(
            "# masks: a masked weight gets a zero gradient, so it stays 0 through the fine-tune",
            "masked = [(m, \"weight\") for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))]",
            *mask, *_finetune(pc),
            "for module, name in masked:",
            "    prune.remove(module, name)  # bake the zeros in: a plain state dict again"),
        notes=(NOT_WRITTEN,))


__all__ = ["RECALIBRATE_BATCHNORM", "portable"]
