"""The swap guard of the PT2E flow: what the converted graph really holds.

Why read the graph: PT2E swaps no modules. ``convert_pt2e`` leaves a flat aten graph in which an int8 layer is a
conv / linear whose weight comes out of a ``dequantize_per_channel`` of an int8 constant, fed by a
``dequantize_per_tensor`` of a quantized activation (static, QAT) or of a ``choose_qparams`` (dynamic); Inductor
then fuses each such pattern into one oneDNN int8 kernel. A quantizer that matched nothing leaves the graph
float without a word, so the lab counts the quantize / dequantize nodes and the int8 weight ops, refuses to call
a graph with none int8 (:func:`check_graph_quantized`), and names what stayed float and why, per module path
(taken from the node's ``nn_module_stack``) and per op with no int8 kernel. Used by :mod:`lab.quant.pt2e`.
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Any

import torch
from torch import nn

from lab.quant.swap import QuantizationNoOpError

_aten = torch.ops.aten
#: Ops with a weight that X86InductorQuantizer can make int8 (Inductor has a fused int8 kernel for each).
INT8_CAPABLE = {_aten.conv1d.default: "conv", _aten.conv2d.default: "conv", _aten.linear.default: "linear"}
#: Weight-carrying ops the quantizer never annotates, with the reason.
NO_INT8 = {
    "lstm": "X86InductorQuantizer annotates no RNN op (torch.export keeps nn.LSTM as one aten.lstm node) and "
            "Inductor has no int8 LSTM kernel",
    "gru": "X86InductorQuantizer annotates no RNN op and Inductor has no int8 GRU kernel",
    "embedding_bag": "X86InductorQuantizer annotates no embedding lookup (a memory-bound gather, no int8 GEMM to "
                     "gain); the legacy flow's weight-only int8 EmbeddingBag shrinks it",
    "embedding": "X86InductorQuantizer annotates no embedding lookup; the legacy flow's weight-only int8 "
                 "Embedding shrinks it",
    "_embedding_bag": "X86InductorQuantizer annotates no embedding lookup",
    "matmul": "an activation x activation matmul: the default x86 config leaves it float",
    "bmm": "an activation x activation matmul: the default x86 config leaves it float",
    "scaled_dot_product_attention": "attention runs float under the default x86 config",
}
#: Module types each PT2E method is asked to quantize (the x86 dynamic config covers Linear only).
PT2E_TARGETS: dict[str, tuple[type[nn.Module], ...]] = {
    "static": (nn.Linear, nn.Conv1d, nn.Conv2d), "qat": (nn.Linear, nn.Conv1d, nn.Conv2d), "dynamic": (nn.Linear,)}
_QUANT_NS = "quantized_decomposed"


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def _is_quant_op(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and _QUANT_NS in str(node.target)


def _is_dequant(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and _is_quant_op(node) and "dequantize" in str(node.target)


def module_path(node: torch.fx.Node) -> tuple[str, str]:
    """(module path, module type name) of the innermost module a node came from; ``("", "")`` when none."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    cls_name = cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))
    return path.split("@")[0], cls_name.rsplit(".", 1)[-1]


def attr_tensor(gm: torch.fx.GraphModule, node: Any) -> torch.Tensor | None:
    """The constant behind a ``get_attr`` node (None for anything else)."""
    if isinstance(node, torch.fx.Node) and node.op == "get_attr":
        value = operator.attrgetter(node.target)(gm)
        return value if isinstance(value, torch.Tensor) else None
    return None


def int8_weight_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Conv / linear nodes whose weight is dequantized from an int8 constant: the layers that run int8."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in INT8_CAPABLE
            and len(n.args) > 1 and _is_dequant(n.args[1])]


def graph_op_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    """How many quantize / dequantize / choose_qparams nodes and int8 conv / linear nodes the graph holds."""
    counts = Counter(_op_name(n) for n in gm.graph.nodes if _is_quant_op(n))
    for n in int8_weight_nodes(gm):
        counts[f"int8_{INT8_CAPABLE[n.target]}"] += 1
    return dict(sorted(counts.items()))


def float_ops(gm: torch.fx.GraphModule) -> dict[str, int]:
    """aten ops that run float between int8 layers: neither fed by a dequantize nor feeding a quantize (an op
    inside a quantized pattern is fused into its int8 kernel by Inductor). Shape-only ops are left out."""
    shape_only = {"sym_size", "view", "reshape", "flatten", "getitem", "_assert_tensor_metadata", "size", "arange",
                  "select", "slice", "squeeze", "unsqueeze", "transpose", "permute", "expand", "t", "zeros"}
    out: Counter[str] = Counter()
    int8 = set(int8_weight_nodes(gm))
    for n in gm.graph.nodes:
        if n.op != "call_function" or _is_quant_op(n) or n in int8 or "aten" not in str(n.target):
            continue
        name = _op_name(n)
        fed = any(_is_dequant(a) for a in n.args if isinstance(a, torch.fx.Node))
        feeds = any(_is_quant_op(u) for u in n.users)
        if not (fed or feeds) and name not in shape_only:
            out[name] += 1
    return dict(sorted(out.items()))


def graph_swap_report(gm: torch.fx.GraphModule, float_model: nn.Module, method: str) -> dict[str, Any]:
    """The legacy swap report's shape (``asked``, ``swapped``, ``kept_float`` + reasons, counts), read from the
    converted graph, plus ``graph`` (quant op counts) and ``float_ops`` (ops left float, with counts)."""
    asked = {n: type(m).__name__ for n, m in float_model.named_modules() if isinstance(m, PT2E_TARGETS[method])}
    swapped: dict[str, str] = {}
    for node in int8_weight_nodes(gm):
        path, cls = module_path(node)
        swapped[path or node.name] = cls or INT8_CAPABLE[node.target]
    reasons: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name, (path, _cls) = _op_name(node), module_path(node)
        if name in NO_INT8 and path:
            reasons.setdefault(path, NO_INT8[name])
        elif node.target in INT8_CAPABLE and node not in int8_weight_nodes(gm) and path in asked:
            reasons.setdefault(path, "X86InductorQuantizer left it float: no annotation matched this node (a "
                                     "weight that is not a constant parameter, or an op pattern it skips)")
    for path in asked:
        if path not in swapped and path not in reasons:
            reasons[path] = "not found as an int8 op in the converted graph"
    kept = sorted(reasons)
    return {"asked": asked, "swapped": swapped, "kept_float": kept, "kept_float_reasons": reasons,
            "n_asked": len(asked), "n_swapped": len([p for p in swapped if p in asked]) or len(swapped),
            "graph": graph_op_counts(gm), "float_ops": float_ops(gm)}


def check_graph_quantized(report: dict[str, Any], method: str) -> None:
    """Refuse to call a graph int8 when no quantize / dequantize node or no int8 layer was inserted."""
    counts = report.get("graph", {})
    n_q = sum(v for k, v in counts.items() if not k.startswith("int8_"))
    n_layers = sum(v for k, v in counts.items() if k.startswith("int8_"))
    if report["n_asked"] == 0 and n_layers == 0:
        raise ValueError(f"quant.method={method!r} (pt2e): the model has no module of the types this method "
                         f"quantizes ({', '.join(t.__name__ for t in PT2E_TARGETS[method])})")
    if n_q == 0 or n_layers == 0:
        raise QuantizationNoOpError(
            f"quant.method={method!r} (pt2e) changed nothing: the converted graph holds {n_q} quantize/dequantize "
            f"op(s) and {n_layers} int8 conv/linear op(s); refusing to report a float model as int8 (stayed "
            f"float: {', '.join(report['kept_float']) or 'every layer'})")


def graph_layer_bytes(gm: torch.fx.GraphModule) -> tuple[int, int]:
    """(fp32 bytes, int8 bytes) of the int8 layers' weights and biases as the graph stores them: int8 weights
    plus their per-channel scales and zero points, against the same weights in fp32 (biases fp32 in both)."""
    f_bytes = q_bytes = 0
    for node in int8_weight_nodes(gm):
        dq = node.args[1]
        w, scale, zp = (attr_tensor(gm, a) for a in dq.args[:3])
        bias = attr_tensor(gm, node.args[2]) if len(node.args) > 2 else None
        b_bytes = bias.numel() * bias.element_size() if bias is not None else 0
        if w is None:
            continue
        f_bytes += w.numel() * 4 + b_bytes
        q_bytes += w.numel() * w.element_size() + b_bytes + sum(
            t.numel() * t.element_size() for t in (scale, zp) if t is not None)
    return f_bytes, q_bytes


__all__ = [
    "attr_tensor", "check_graph_quantized", "float_ops", "graph_layer_bytes", "graph_op_counts",
    "graph_swap_report", "int8_weight_nodes", "module_path", "NO_INT8", "PT2E_TARGETS",
]
