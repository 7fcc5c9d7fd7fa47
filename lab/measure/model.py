"""Static facts about a model: parameters, non-zeros, checkpoint bytes and MACs per forward.

Why here and not in a technique package: pruning, quantization and every run report the same counts, and a
speedup is read against them ("2x fewer MACs, 1.1x faster"), so they must be counted one way.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def count_params(model: nn.Module) -> int:
    """Number of parameters (shared tensors once). Pruning masks are buffers, so a pruned layer counts
    its ``weight_orig`` once. Dynamically quantized layers keep weights in packed params, not
    ``nn.Parameter``; those are counted through their ``weight()`` accessor."""
    total = sum(p.numel() for p in model.parameters())
    for w in _packed_weights(model):
        total += w.numel()
    return total


def count_nonzero_params(model: nn.Module) -> int:
    """Non-zero *effective* weights. For torch.nn.utils.prune reparametrisations the effective weight is
    ``module.weight`` (= ``weight_orig * weight_mask``), which is what the forward pass uses."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            tensor = param.detach()
            if name.endswith("_orig"):  # recompute: module.weight is only refreshed by a forward
                base = name[: -len("_orig")]
                mask = getattr(module, base + "_mask", None)
                effective = tensor * mask if isinstance(mask, torch.Tensor) else getattr(module, base, None)
                if isinstance(effective, torch.Tensor):
                    tensor = effective.detach()
            total += int(torch.count_nonzero(tensor).item())
    for w in _packed_weights(model):
        total += int(torch.count_nonzero(w.dequantize() if w.is_quantized else w).item())
    return total


def _packed_weights(model: nn.Module) -> Iterable[torch.Tensor]:
    """Weights of quantized modules that hide them from ``parameters()`` (best effort)."""
    for module in model.modules():
        if next(module.parameters(recurse=False), None) is not None:
            continue
        for attr in ("weight", "bias"):
            getter = getattr(type(module), attr, None)
            if callable(getter) and not isinstance(getter, property):
                try:
                    t = getattr(module, attr)()
                except Exception:  # arbitrary modules; absent weight is fine
                    continue
                if isinstance(t, torch.Tensor):
                    yield t


def serialized_size_bytes(model: nn.Module) -> int:
    """Bytes of ``torch.save(model.state_dict())``: what a checkpoint actually costs on disk (a pruned
    layer still stores ``weight_orig`` and the mask until ``prune.remove``)."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getbuffer().nbytes


# ----------------------------------------------------------------------------------------------- MACs

_RNN_GATES = {nn.LSTM: 4, nn.GRU: 3, nn.RNN: 1}


def _rnn_macs(module: nn.RNNBase, inputs: tuple) -> int:
    """MACs of one RNN forward: per layer, direction, time step and sample,
    gates * (in * h + h_out * h) (+ h * proj for LSTM projections). Elementwise gate math is ignored,
    as for every other layer."""
    x = inputs[0]
    if isinstance(x, nn.utils.rnn.PackedSequence):
        sample_steps = int(x.data.shape[0])  # sum of lengths = real (sample, step) pairs
    elif x.dim() == 2:  # unbatched (seq, feature)
        sample_steps = int(x.shape[0])
    else:
        sample_steps = int(x.shape[0] * x.shape[1])
    gates = next(g for cls, g in _RNN_GATES.items() if isinstance(module, cls))
    h = module.hidden_size
    proj = getattr(module, "proj_size", 0) or 0
    h_out = proj or h
    dirs = 2 if module.bidirectional else 1
    per_step = 0
    for layer in range(module.num_layers):
        in_size = module.input_size if layer == 0 else h_out * dirs
        per_step += dirs * (gates * (in_size * h + h_out * h) + (h * proj if proj else 0))
    return per_step * sample_steps


def count_macs(model: nn.Module, example_inputs: tuple) -> int:
    """Multiply-accumulates of ONE forward of ``example_inputs`` (divide by the batch for per-sample).

    FlopCounterMode sees aten matmuls/convs but not fused RNN kernels (aten.lstm counts 0 on CPU and
    cudnn RNNs count 0 on GPU, while CPU GRU is decomposed and partly counted), so for every nn.RNN/
    LSTM/GRU the counter's own figure inside the module is replaced by the closed formula. Runs in eval
    mode under no_grad (no BN statistics updated, no graph kept) and restores each module's mode.
    """
    from torch.utils.flop_counter import FlopCounterMode

    modes = {m: m.training for m in model.modules()}
    counter = FlopCounterMode(display=False)
    correction = {"flops": 0}
    stack: list[int] = []

    def pre(module: nn.Module, inputs: tuple) -> None:
        stack.append(counter.get_total_flops())

    def post(module: nn.Module, inputs: tuple, output: Any) -> None:
        counted = counter.get_total_flops() - stack.pop()
        correction["flops"] += 2 * _rnn_macs(module, inputs) - counted  # type: ignore[arg-type]

    handles = []
    for m in model.modules():
        if isinstance(m, tuple(_RNN_GATES)):
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    try:
        model.eval()
        with torch.no_grad(), counter:
            model(*example_inputs)
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.train(training)
    return int((counter.get_total_flops() + correction["flops"]) // 2)

__all__ = [
    "count_macs", "count_nonzero_params", "count_params", "serialized_size_bytes",
]
