"""What int8 really changed: the modules each method is asked to quantize, the swap report (which were
replaced, which stayed float and why, per layer), the guard that refuses a no-op, the check that refuses
before training a model in which a method could replace nothing, and the fixes that let int8 modules run
inside standard blocks (a Transformer encoder layer's fused path; QAT fake-quant that FX could not reach; model
code reading ``next(self.parameters())`` when no float parameter is left).

Why per-layer reasons: torch.ao skips modules silently. FX graph mode (static, QAT) runs every ``torch.nn``
module except ``Sequential`` as one opaque leaf, so the Linears inside an ``nn.TransformerEncoder`` are never
seen; ``nn.MultiheadAttention`` multiplies its projection weights directly, so no module swap reaches them;
dynamic int8 has no convolution kernel. A run that quantized 2 of 8 layers must say which 6 stayed float and
why, and a run that could quantize nothing is refused before it trains. Used by :mod:`lab.quant.int8`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lab.workloads.hf import is_conv1d

#: Module types each method is asked to quantize (static/QAT also quantize the ops between them).
TARGETS: dict[str, tuple[type[nn.Module], ...]] = {
    "dynamic": (nn.Linear, nn.LSTM, nn.GRU, nn.EmbeddingBag, nn.Embedding),
    "static": (nn.Linear, nn.Conv2d, nn.EmbeddingBag, nn.Embedding),
    "qat": (nn.Linear, nn.Conv2d, nn.EmbeddingBag, nn.Embedding),
}
_FLOAT_WEIGHT_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.LSTM, nn.GRU, nn.EmbeddingBag, nn.Embedding,
                        nn.MultiheadAttention)
#: Embeddings narrower than this stay float: int8 rows carry a float scale and zero point each (8 bytes),
#: so a 1-wide table (DLRM's wide part) would grow from 4 to 9 bytes per row.
MIN_EMBEDDING_DIM = 8
API = {
    "dynamic": "torch.ao.quantization.quantize_dynamic",
    "static": "torch.ao.quantization.quantize_fx (prepare_fx / calibrate / convert_fx)",
    "qat": "torch.ao.quantization.quantize_fx (prepare_qat_fx / fine-tune / convert_fx)",
}


WHY_CONV1D = ("a Hugging Face Conv1D (GPT-2 style: y = x @ W + b, weight [in, out]) is not a torch.nn type, so "
              "torch.ao and X86InductorQuantizer never match it; the lab quantizes an equivalent nn.Linear "
              "(weight W.T) in its place")


def conv1d_as_linear(module: nn.Module) -> nn.Linear:
    """The ``nn.Linear`` computing what the HF ``Conv1D`` ``module`` computes (same values, weight transposed)."""
    w = module.weight
    bias = getattr(module, "bias", None)
    lin = nn.Linear(w.shape[0], w.shape[1], bias=bias is not None, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w.detach().t())
        if bias is not None:
            lin.bias.copy_(bias.detach())
    lin.train(module.training)
    return lin


def linearize_conv1d(model: nn.Module) -> list[str]:
    """Replace every HF ``Conv1D`` of ``model`` in place by its equivalent ``nn.Linear`` (call on a copy);
    returns the layers replaced. A tied Conv1D weight would be untied by the copy: refused."""
    names = [n for n, m in model.named_modules() if is_conv1d(m)]
    shared = {id(p) for n, m in model.named_modules() if not is_conv1d(m) for p in m._parameters.values()
              if p is not None}
    for n in names:
        m = model.get_submodule(n)
        if id(m.weight) in shared:
            raise ValueError(f"{n} ({type(m).__name__}) shares its weight with another module (weight tying): an "
                             "int8 copy would untie them; leave it out of quantization")
        parent, _, attr = n.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, conv1d_as_linear(m))
    return names


def _bare_weight_holder(module: nn.Module) -> bool:
    """A module of a type the lab does not know that holds a float weight matrix itself (a HF Conv1D, a
    custom layer): it stays float under every torch.ao method and must be listed as such."""
    return not _is_quantized_module(module) and any(
        p is not None and p.is_floating_point() and p.dim() >= 2 for p in module._parameters.values())


class QuantizationNoOpError(RuntimeError):
    """Nothing that was asked for was actually quantized: refuse to report a float model as int8."""


def narrow_embeddings(model: nn.Module) -> list[str]:
    """Names of embedding tables too narrow for int8 to save bytes (see ``MIN_EMBEDDING_DIM``)."""
    return [n for n, m in model.named_modules()
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.embedding_dim < MIN_EMBEDDING_DIM]


def _is_quantized_module(module: nn.Module) -> bool:
    path = type(module).__module__
    return ".quantized" in path and "PackedParam" not in type(module).__name__


def _fx_leaf(name: str, model: nn.Module) -> tuple[str, nn.Module] | None:
    """The outermost proper ancestor of ``name`` that FX graph mode calls as one opaque module: torch.ao's
    QuantizationTracer treats every ``torch.nn`` / ``torch.ao.nn`` module except ``Sequential`` as a leaf."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        anc = ".".join(parts[:i])
        m = model.get_submodule(anc)
        if type(m).__module__.startswith(("torch.nn.", "torch.ao.nn.")) and not isinstance(m, nn.Sequential):
            return anc, m
    return None


WHY_MHA = ("nn.MultiheadAttention multiplies its in_proj_weight (a bare Parameter) and out_proj.weight directly in "
           "F.multi_head_attention_forward; torch.ao swaps modules, not parameters (torch types out_proj "
           "NonDynamicallyQuantizableLinear for this reason)")


def kept_float_reason(name: str, model: nn.Module, method: str, on_purpose: dict[str, str] | None = None) -> str:
    """Why the layer ``name`` of the float ``model`` stays float under ``method``, in one line."""
    if on_purpose and name in on_purpose:
        return on_purpose[name]
    mods = dict(model.named_modules())
    m = mods.get(name)
    parent = mods.get(name.rpartition(".")[0]) if "." in name else model
    if isinstance(m, nn.MultiheadAttention) or (isinstance(parent, nn.MultiheadAttention)
                                                and name.endswith("out_proj")):
        return WHY_MHA
    leaf = _fx_leaf(name, model) if method != "dynamic" else None
    if leaf is not None:
        hint = "; quant.method='dynamic' quantizes it" if type(m) is nn.Linear else ""
        return (f"inside {leaf[0]} ({type(leaf[1]).__name__}), which FX graph mode runs as one opaque torch.nn "
                f"module (its Python control flow is not traced), so {method} int8 never reaches it{hint}")
    if isinstance(m, nn.RNNBase) and method != "dynamic":
        return f"torch.ao {method} int8 (FX) has no {type(m).__name__} kernel; quant.method='dynamic' quantizes it"
    if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d) and method == "dynamic":
        return ("dynamic int8 has no convolution kernel (quantize_dynamic covers Linear, LSTM, GRU, embeddings); "
                "quant.method='static' or 'qat' quantizes convolutions")
    if isinstance(m, nn.Conv1d) and method != "dynamic":
        return f"not in the {method} mapping of this lab (Conv2d and Linear are)"
    if m is not None and is_conv1d(m):
        return WHY_CONV1D.replace("the lab quantizes", "lab.quant.swap.linearize_conv1d quantizes")
    if m is not None and type(m) not in _FLOAT_WEIGHT_LAYERS and _bare_weight_holder(m):
        held = ", ".join(pn for pn, p in m._parameters.items() if p is not None and p.dim() >= 2)
        return (f"{type(m).__name__} holds float weight tensor(s) itself ({held}) and is not a layer type torch.ao "
                "quantizes (it swaps " + ", ".join(t.__name__ for t in TARGETS[method]) + " modules only)")
    return f"{API[method].split(' ')[0]} left it float without saying why"


def swap_report(float_model: nn.Module, quantized: nn.Module, method: str,
                on_purpose: dict[str, str] | None = None) -> dict[str, Any]:
    """Which modules the method was asked to quantize, which were replaced, which stayed float and why.

    Names are matched by path; BatchNorms folded into convolutions disappear and are not asked for.
    ``kept_float`` also lists weight layers the method does not handle (an LSTM under static int8, an
    attention); ``kept_float_reasons`` gives each one's reason (:func:`kept_float_reason`)."""
    asked = {n: type(m).__name__ for n, m in float_model.named_modules() if isinstance(m, TARGETS[method])}
    swapped = {n: type(m).__name__ for n, m in quantized.named_modules() if _is_quantized_module(m)}
    still_float = {n for n, m in quantized.named_modules() if type(m) in _FLOAT_WEIGHT_LAYERS or (
        n and n not in swapped and _bare_weight_holder(m))}
    kept = sorted({n for n in asked if n not in swapped} | still_float)
    return {"asked": asked, "swapped": swapped, "kept_float": kept,
            "kept_float_reasons": {n: kept_float_reason(n, float_model, method, on_purpose) for n in kept},
            "n_asked": len(asked), "n_swapped": len([n for n in asked if n in swapped])}


def expected_swaps(model: nn.Module, method: str) -> tuple[list[str], dict[str, str]]:
    """Before any training: the layers ``method`` can be expected to replace, and ``{layer: reason}`` for
    those it cannot (the same reasons the swap report gives afterwards)."""
    skip = dict.fromkeys(narrow_embeddings(model), f"embedding_dim < {MIN_EMBEDDING_DIM}")
    asked = [n for n, m in model.named_modules() if isinstance(m, TARGETS[method]) or is_conv1d(m)]
    reasons = {}
    for n, m in model.named_modules():
        if is_conv1d(m):  # quantized as its equivalent nn.Linear (linearize_conv1d)
            if method != "dynamic" and _fx_leaf(n, model) is not None:
                reasons[n] = kept_float_reason(n, model, method, skip)
            continue
        if not isinstance(m, _FLOAT_WEIGHT_LAYERS):
            continue
        if n not in asked or n in skip or (method != "dynamic" and _fx_leaf(n, model) is not None) or (
                method == "dynamic" and isinstance(m, nn.modules.linear.NonDynamicallyQuantizableLinear)):
            reasons[n] = kept_float_reason(n, model, method, skip)
    return [n for n in asked if n not in reasons], reasons


def check_model(model: nn.Module, method: str) -> None:
    """Refuse before training a model in which ``method`` has nothing it can replace, saying why per layer."""
    ok, reasons = expected_swaps(model, method)
    if not ok:
        why = "; ".join(f"{n}: {r}" for n, r in reasons.items()) or (
            "no module of the types it quantizes (" + ", ".join(t.__name__ for t in TARGETS[method]) + ")")
        raise ValueError(f"quant.method={method!r} would quantize nothing in {type(model).__name__}: {why}")


def _unfused_path(module: nn.Module, args: tuple) -> None:
    """A no-op forward pre-hook: ``nn.TransformerEncoderLayer`` takes its unfused path when hooked."""


WHY_FASTPATH = ("the fused TransformerEncoderLayer inference path reads linear1/linear2 .weight as float tensors, "
                "which int8 modules do not have; a no-op forward pre-hook makes these layers take their unfused "
                "path (torch fuses only unhooked layers), and their TransformerEncoder gets use_nested_tensor=False")


def keep_int8_layers_unfused(model: nn.Module) -> list[str]:
    """Send every Transformer encoder layer holding an int8 module down its unfused path (the fused one
    would call ``.device`` on the int8 module's ``weight`` method); returns the layers' names."""
    names = []
    for n, m in model.named_modules():
        has_int8 = any(_is_quantized_module(c) for c in m.modules())
        if isinstance(m, nn.TransformerEncoderLayer) and has_int8:
            if _unfused_path not in m._forward_pre_hooks.values():
                m.register_forward_pre_hook(_unfused_path)
            names.append(n)
        elif isinstance(m, nn.TransformerEncoder) and has_int8:
            m.use_nested_tensor = False
    return names


#: The empty float parameter :func:`keep_a_float_parameter` registers on an int8 model left without any.
FLOAT_ANCHOR = "lab_float_parameter"
WHY_FLOAT_ANCHOR = ("every parameter of the model became int8 (packed weights are not nn.Parameters), and model code "
                    "reading next(model.parameters()) for a dtype or device (PyTorch's word_language_model "
                    "init_hidden does, on every call) would raise StopIteration; an empty float parameter, "
                    f"{FLOAT_ANCHOR!r}, is registered on the int8 model so that such code keeps working")


def keep_a_float_parameter(float_model: nn.Module, quantized: nn.Module) -> str | None:
    """Register :data:`FLOAT_ANCHOR` (an empty, frozen tensor of the float model's first parameter's dtype, on CPU)
    on ``quantized`` when the float model had parameters and ``quantized`` has none left (see
    :data:`WHY_FLOAT_ANCHOR`); returns its name, or None when nothing was needed."""
    first = next(float_model.parameters(), None)
    if first is None or next(quantized.parameters(), None) is not None:
        return None
    quantized.register_parameter(FLOAT_ANCHOR, nn.Parameter(torch.empty(0, dtype=first.dtype), requires_grad=False))
    return FLOAT_ANCHOR


def restore_float_leftovers(model: nn.Module) -> list[str]:
    """QAT modules convert_fx could not reach (inside a module FX did not trace): back to plain float."""
    names = []
    for n, m in list(model.named_modules()):
        if type(m).__module__.startswith("torch.ao.nn.qat") and hasattr(m, "to_float") and n:
            parent_name, _, attr = n.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, attr, m.to_float())
            names.append(n)
    return names


def check_swapped(report: dict[str, Any], method: str) -> None:
    """Raise unless at least one module that was asked for is now quantized."""
    if report["n_asked"] == 0:
        raise ValueError(f"quant.method={method!r}: the model has no module of the types this method quantizes "
                         f"({', '.join(t.__name__ for t in TARGETS[method])})")
    if report["n_swapped"] == 0:
        raise QuantizationNoOpError(
            f"quant.method={method!r} changed nothing: none of {sorted(report['asked'])} was replaced by an int8 "
            "module (the library skipped them silently); refusing to report a float model as int8")


__all__ = [
    "API", "check_model", "check_swapped", "conv1d_as_linear", "expected_swaps", "FLOAT_ANCHOR", "is_conv1d",
    "keep_a_float_parameter", "keep_int8_layers_unfused", "kept_float_reason", "linearize_conv1d", "WHY_CONV1D",
    "WHY_FLOAT_ANCHOR",
    "MIN_EMBEDDING_DIM", "narrow_embeddings", "QuantizationNoOpError", "restore_float_leftovers", "swap_report",
    "TARGETS", "WHY_FASTPATH", "WHY_MHA",
]
