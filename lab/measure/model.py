"""Static facts about a model: parameters, non-zeros, checkpoint bytes and MACs per forward.

Why here and not in a technique package: pruning, quantization and every run report the same counts, and a
speedup is read against them ("2x fewer MACs, 1.1x faster"), so they must be counted one way.
"""

from __future__ import annotations

import contextlib
import io
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn


def module_device(module: nn.Module, default: torch.device | str = "cpu") -> torch.device:
    """Where ``module`` lives: its first parameter's device, else its first buffer's, else ``default``. Never
    ``next(module.parameters())`` alone: an int8 model keeps its weights in packed params, and a module may hold
    only buffers, or nothing."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    return first.device if first is not None else torch.device(default)


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


def _packed_weights(model: nn.Module, recurse: bool = True) -> Iterable[torch.Tensor]:
    """Weights of quantized modules that hide them from ``parameters()`` (best effort)."""
    for module in (model.modules() if recurse else (model,)):
        if next(module.parameters(recurse=False), None) is not None:
            continue
        if callable(getattr(type(module), "get_weight", None)) and callable(getattr(type(module), "get_bias", None)):
            try:  # dynamic int8 LSTM / GRU: {"weight_ih_l0": ..., ...} and the same for biases
                packed = [*module.get_weight().values(), *module.get_bias().values()]
            except Exception:  # arbitrary modules with such methods; best effort
                packed = []
            yield from (t for t in packed if isinstance(t, torch.Tensor))
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


def _rnn_macs(module: nn.Module, inputs: tuple, gates: int | None = None) -> int:
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
    if gates is None:
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


#: FlopCounterMode has no formula for the CPU flash-attention kernel that ``F.scaled_dot_product_attention``
#: dispatches to on CPU (it has the CUDA ones); this is the same two-bmm count.
def _sdpa_flops(query_shape: tuple, key_shape: tuple, value_shape: tuple, *args: Any, out_shape: Any = None,
                **kwargs: Any) -> int:
    b, h, s_q, d_q = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * b * h * s_q * s_k * (d_q + d_v)


def _custom_flop_formulas() -> dict[Any, Any]:
    names = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable")
    # the counter looks formulas up by overload packet
    ops = [getattr(torch.ops.aten, name) for name in names if hasattr(torch.ops.aten, name)]
    return dict.fromkeys(ops, _sdpa_flops)


@contextlib.contextmanager
def _mha_fastpath_off() -> Iterator[None]:
    """The fused ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` inference kernels
    (``torch._transformer_encoder_layer_fwd``, ``_native_multi_head_attention``) are invisible to
    FlopCounterMode; the unfused path computes the same math through counted matmuls. Restored after."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def _is_int8(module: nn.Module) -> bool:
    """A torch.ao quantized (static or dynamic) module: its int8 kernels are invisible to FlopCounterMode."""
    return ".quantized" in type(module).__module__ and "PackedParam" not in type(module).__name__


def _int8_macs(module: nn.Module, inputs: tuple, output: Any) -> int | None:
    """MACs of one forward of a quantized Linear / Conv / LSTM / GRU module (None: not a MAC layer, e.g. an
    int8 embedding lookup, a quantize stub or an elementwise op)."""
    name = type(module).__name__
    if name in ("LSTM", "GRU") and hasattr(module, "hidden_size"):
        return _rnn_macs(module, inputs, gates={"LSTM": 4, "GRU": 3}[name])
    weight = getattr(module, "weight", None)
    if not callable(weight) or "Embedding" in name:
        return None
    out = output[0] if isinstance(output, tuple) else output
    if not isinstance(out, torch.Tensor) or out.dim() == 0:
        return None
    w = weight()
    if hasattr(module, "kernel_size"):  # conv: channels are dim 1
        return (out.numel() // out.shape[1]) * w.numel() if out.dim() > 1 else None
    return (out.numel() // out.shape[-1]) * w.numel()


def count_macs_by_dtype(model: nn.Module, example_inputs: tuple) -> dict[str, int]:
    """Multiply-accumulates of ONE forward of ``example_inputs``, split into ``{"fp32": float MACs,
    "int8": MACs run by torch.ao quantized Linear/Conv/LSTM/GRU modules}`` (divide by the batch for
    per-sample; "fp32" means the float kernels, whatever float dtype they ran in).

    Float MACs come from FlopCounterMode, which sees aten matmuls/convs but not: fused RNN kernels (aten.lstm
    counts 0 on CPU, cudnn RNNs 0 on GPU, CPU GRU is partly counted), so every nn.RNN/LSTM/GRU's own figure
    is replaced by the closed formula; the fused MultiheadAttention / TransformerEncoderLayer inference fast
    path, so counting runs with ``torch.backends.mha`` fast path off (same math, unfused); the CPU
    flash-attention kernel, which gets its two-bmm formula. Int8 kernels are invisible to the counter, so each
    quantized Linear/Conv counts ``output positions x weight entries`` (RNNs: the formula) from a forward
    hook. Runs in eval mode under no_grad (no BN statistics updated, no graph kept), restoring every mode; a model
    that hands a submodule a view of a parameter (a Perceiver's ``self.latents.expand(-1, b, -1)``) is counted with
    grad on instead: made under no_grad, such a view requires grad without a grad function, and the counter's
    module tracker, which hooks every input that requires grad, raises on it.
    """
    try:
        return _count_macs_by_dtype(model, example_inputs, grad=False)
    except AssertionError as exc:  # torch.autograd.graph: "Expected gradient function to be set"
        if "gradient function" not in str(exc):
            raise
        return _count_macs_by_dtype(model, example_inputs, grad=True)


def _count_macs_by_dtype(model: nn.Module, example_inputs: tuple, *, grad: bool) -> dict[str, int]:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=_custom_flop_formulas())
    fp32_fix = {"flops": 0}
    int8 = {"macs": 0}
    stack: list[int] = []

    def pre(module: nn.Module, inputs: tuple) -> None:
        stack.append(counter.get_total_flops())

    def rnn_post(module: nn.Module, inputs: tuple, output: Any) -> None:
        counted = counter.get_total_flops() - stack.pop()
        fp32_fix["flops"] += 2 * _rnn_macs(module, inputs) - counted  # type: ignore[arg-type]

    def int8_post(module: nn.Module, inputs: tuple, output: Any) -> None:
        counted = counter.get_total_flops() - stack.pop()
        macs = _int8_macs(module, inputs, output)
        if macs is not None:
            fp32_fix["flops"] -= counted  # whatever float work the counter saw inside is part of the int8 op
            int8["macs"] += macs

    handles = []
    for m in model.modules():
        if isinstance(m, tuple(_RNN_GATES)):
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(rnn_post)]
        elif _is_int8(m):
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(int8_post)]
    with hooks_removed(handles), evaluation_mode(model), torch.set_grad_enabled(grad), _mha_fastpath_off(), counter:
        model(*example_inputs)
    return {"fp32": int((counter.get_total_flops() + fp32_fix["flops"]) // 2), "int8": int8["macs"]}


def count_macs(model: nn.Module, example_inputs: tuple) -> int:
    """Multiply-accumulates of ONE forward of ``example_inputs``, float and int8 together (divide by the
    batch for per-sample); :func:`count_macs_by_dtype` splits them."""
    return sum(count_macs_by_dtype(model, example_inputs).values())


_EMBEDDING_NAMES = ("Embedding", "EmbeddingBag")


def weights_used_per_sample(model: nn.Module) -> int:
    """A lower bound on the multiply-accumulates one sample costs in a dense model: the entries of every
    weight matrix / kernel (parameters and int8 packed weights with >= 2 dims, shared tensors once) except
    embedding tables, which are looked up, not multiplied. 1-d parameters (biases, norm scales) are left out:
    they are elementwise. Each such weight is applied at least once per sample unless the model skips layers
    per sample (mixture of experts, early exit), where this is not a bound."""
    seen: set[int] = set()
    embedding_ids = {id(p) for m in model.modules() if type(m).__name__ in _EMBEDDING_NAMES
                     for p in m.parameters(recurse=False)}
    total = 0
    for p in model.parameters():
        if id(p) not in seen and id(p) not in embedding_ids and p.dim() >= 2:
            total += p.numel()
        seen.add(id(p))
    for m in model.modules():
        if _is_int8(m) and type(m).__name__ not in _EMBEDDING_NAMES:
            for w in _packed_weights(m, recurse=False):
                if w.dim() >= 2:
                    total += w.numel()
    return total


def weights_used_per_sample_guard(model: nn.Module, macs_per_sample: float) -> str | None:
    """A warning when ``macs_per_sample`` (as counted) is below :func:`weights_used_per_sample`: some
    kernel ran without being counted (a fused path, an op without a formula), so the MAC figure is too low
    to read a speedup against. None when the count is plausible."""
    used = weights_used_per_sample(model)
    if macs_per_sample >= used:
        return None
    return (f"MACs per sample look undercounted: {macs_per_sample:,.0f} counted, but one sample uses {used:,} "
            "weights (matrices and kernels, embeddings excluded); a kernel the counter cannot see ran "
            "(fused or custom op)")

__all__ = [
    "count_macs", "count_macs_by_dtype", "count_nonzero_params", "count_params", "evaluation_mode", "hooks_removed",
    "module_device", "serialized_size_bytes", "weights_used_per_sample", "weights_used_per_sample_guard",
]


@contextlib.contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[nn.Module]:
    """One look at a model: eval mode under ``no_grad`` (no BatchNorm statistics updated, no graph kept),
    every module's own mode restored afterwards (a model mid-training may mix modes)."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        for m, training in modes.items():
            m.train(training)


@contextlib.contextmanager
def hooks_removed(handles: Iterable[Any]) -> Iterator[None]:
    """Remove every hook in ``handles`` when the block ends, however it ends: a look at a model through forward
    hooks (shapes, inputs, MACs) must leave no hook behind to fire in the next training step."""
    try:
        yield
    finally:
        for h in handles:
            h.remove()
