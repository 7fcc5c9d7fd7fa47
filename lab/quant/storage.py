"""What an int8 model stores, by role, and no more than it needs.

Why: a size ratio alone hides where the bytes go. int8 weights are a quarter of fp32, but each layer also stores
per-channel scales, zero points and a bias, and a file pays its own container overhead; on a tiny layer those
decide the ratio. So the lab counts the stored tensors by role (:data:`ROLES`) for the quantized layers and the
whole model, beside the serialized total (``details["quant"]["bytes_by_role"]``).

What can shrink, and what the format forces:

* **PT2E** (:func:`compact_int8_graph`): ``convert_pt2e`` keeps, per int8 weight, an int64 zero-point vector
  (all 0: X86InductorQuantizer's weights are symmetric) and leaves the original fp32 weights registered on the
  graph although no node reads them. The unread constants are deleted, and the zero points are stored as int8:
  the zero point of an int8 code lies in its range [-128, 127] by definition, ``dequantize_per_channel``
  subtracts it after casting the codes to float whatever its integer dtype, and Inductor's int8 weight prepack
  takes it as it comes (checked on a 16x8 Linear, an MLP and a conv net, static and dynamic: the frozen compiled
  model, the converted graph run eagerly and the graph compiled without freezing, where the dequantize is not
  fused and lowers on its own, give bit-identical outputs to int64 zero points). 1 byte instead of 8 per output
  channel; dropping them (``zero_points=None``) would save that byte too but an unfused dequantize then fails to
  lower ("'NoneType' object has no attribute 'get_size'"). Scales stay as the quantizer made them (fp32 here):
  with an fp32 scale and an fp32 bias per output channel a layer with ``k`` inputs per output stores at best
  ``(4k + 4) / (k + 9)`` times fewer bytes than fp32, >= 3.9x only from ``k`` >= 311 (:func:`size_bound`).
* **legacy** (torch.ao): a quantized Linear / Conv stores its weight as a quantized tensor inside packed
  params, and ``torch.save`` writes a per-channel tensor's scales as fp64 and zero points as int64 (16 bytes
  per output channel), whatever the values; the kernels read that format, so it is reported, not changed.
  Its int8 embeddings store per-row fp32 scale and zero point (``per_channel_affine_float_qparams``).
"""

from __future__ import annotations

import io
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from lab.quant.graph import int8_weight_nodes

#: Roles a stored byte can have: int8 (or uint8) weight codes, their scales and zero points, biases, any
#: other tensor (float layers, activation qparams, index buffers), and the file's own overhead.
ROLES = ("int8_weights", "scales", "zero_points", "bias", "other", "container")

WHY_LEGACY_FORMAT = ("legacy format: torch.save writes a per-channel quantized weight's scales as fp64 and zero "
                     "points as int64 (16 bytes per output channel, all-zero zero points included); the packed "
                     "int8 kernels read that format, so it is not changed")
WHY_PT2E_FORMAT = ("PT2E: the fp32 weights convert_pt2e leaves unread are deleted; the int64 per-channel weight "
                   "zero points are stored as int8 (1 byte per output channel instead of 8; an int8 code's zero "
                   "point fits int8, outputs bit-identical), not dropped: with zero_points=None a "
                   "dequantize_per_channel that Inductor does not fuse into an int8 kernel fails to lower; "
                   "scales (fp32) and biases (fp32) are stored as the quantizer made them")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _serialized(obj: Any) -> int:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getbuffer().nbytes


def _set_attr(gm: nn.Module, target: str, value: Any) -> None:
    owner, _, leaf = target.rpartition(".")
    mod = gm.get_submodule(owner) if owner else gm
    if value is None:
        delattr(mod, leaf)
    else:
        setattr(mod, leaf, value)


def _narrow_zero_points(gm: torch.fx.GraphModule) -> list[str]:
    """Store each int8 weight's zero points as int8 (in place); returns the attributes narrowed. A zero point
    outside [-128, 127] (none for an int8 code) is left as it is."""
    narrowed: list[str] = []
    for node in int8_weight_nodes(gm):
        zp_node = node.args[1].args[2] if len(node.args[1].args) > 2 else None
        if not (isinstance(zp_node, torch.fx.Node) and zp_node.op == "get_attr") or zp_node.target in narrowed:
            continue
        zp = operator.attrgetter(zp_node.target)(gm)
        if (isinstance(zp, torch.Tensor) and zp.dtype != torch.int8 and not zp.is_floating_point()
                and (zp.numel() == 0 or (int(zp.min()) >= -128 and int(zp.max()) <= 127))):
            _set_attr(gm, zp_node.target, zp.to(torch.int8))
            narrowed.append(zp_node.target)
    return narrowed


def compact_int8_graph(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """Make a converted PT2E graph store what it needs, in place: every constant no node reads is deleted (the
    fp32 weights convert_pt2e leaves behind) and the weights' zero points become int8
    (:data:`WHY_PT2E_FORMAT`). Returns what was done."""
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    removed = {}
    for key, value in list(gm.state_dict().items()):
        if key not in used:
            removed[key] = _nbytes(value)
            _set_attr(gm, key, None)
    narrowed = _narrow_zero_points(gm)
    return {"zero_points_dropped": 0, "zero_points_as_int8": len(narrowed), "unread_constants_deleted": sorted(removed),
            "bytes_deleted": sum(removed.values()), "why": WHY_PT2E_FORMAT}


def size_bound(k: int, scale_bytes: int = 4, zero_point_bytes: int = 1, bias: bool = True) -> float:
    """The best fp32 / int8 byte ratio of a layer with ``k`` weights per output channel: int8 codes plus one
    scale, zero point and (fp32) bias per channel, against fp32 weights and bias."""
    b = 4 if bias else 0
    return (4 * k + b) / (k + scale_bytes + zero_point_bytes + b)


def _breakdown(items: Iterable[tuple[str, torch.Tensor]], serialized: int) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(ROLES, 0)
    dtypes: dict[str, set[str]] = {r: set() for r in ROLES}
    for role, t in items:
        out[role] += _nbytes(t)
        dtypes[role].add(str(t.dtype).removeprefix("torch."))
    out["container"] = serialized - sum(out[r] for r in ROLES if r != "container")
    out["total"] = serialized
    out["dtypes"] = {r: sorted(d) for r, d in dtypes.items() if d}
    return out


def graph_bytes_by_role(gm: torch.fx.GraphModule) -> dict[str, dict[str, Any]]:
    """Bytes by role of a converted PT2E graph: ``quantized_layers`` (the int8 layers' weights, scales, zero
    points and biases, serialized alone) and ``model`` (its whole state dict)."""
    role_of: dict[str, str] = {}
    for node in int8_weight_nodes(gm):
        for arg, role in zip(node.args[1].args[:3], ("int8_weights", "scales", "zero_points"), strict=False):
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                role_of[arg.target] = role
        if len(node.args) > 2 and isinstance(node.args[2], torch.fx.Node) and node.args[2].op == "get_attr":
            role_of[node.args[2].target] = "bias"
    sd = gm.state_dict()
    layers = {k: v for k, v in sd.items() if k in role_of}
    return {"quantized_layers": _breakdown(((role_of[k], v) for k, v in layers.items()), _serialized(layers)),
            "model": _breakdown(((role_of.get(k, "other"), v) for k, v in sd.items()), _serialized(sd))}


def _legacy_items(key: str, value: Any) -> Iterable[tuple[str, torch.Tensor]]:
    """(role, tensor) pairs of one legacy state-dict entry as ``torch.save`` writes it."""
    if isinstance(value, tuple | list):  # packed params: (quantized weight, float bias or None)
        for v in value:
            if isinstance(v, torch.Tensor) and not v.is_quantized:
                yield "bias", v
            else:
                yield from _legacy_items(key, v)
    elif isinstance(value, torch.Tensor) and value.is_quantized:
        yield "int8_weights", value.int_repr()
        if value.qscheme() in (torch.per_channel_affine, torch.per_channel_affine_float_qparams):
            yield "scales", value.q_per_channel_scales()
            yield "zero_points", value.q_per_channel_zero_points()
        else:  # pickled as a Python float and int
            yield "scales", torch.zeros((), dtype=torch.float64)
            yield "zero_points", torch.zeros((), dtype=torch.int64)
    elif isinstance(value, torch.Tensor):
        leaf = key.rsplit(".", 1)[-1]
        role = {"bias": "bias", "scale": "scales", "zero_point": "zero_points"}.get(leaf, "other")
        yield role, value


def legacy_bytes_by_role(model: nn.Module, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Bytes by role of a legacy int8 model: ``quantized_layers`` (the named modules, serialized together) and
    ``model`` (its whole state dict); packed params are opened into their weight codes, scales and zero points."""
    mods = dict(model.named_modules())
    layer_sd = {n: mods[n].state_dict() for n in names if n in mods}
    layer_items = [it for sd in layer_sd.values() for k, v in sd.items() for it in _legacy_items(k, v)]
    sd = model.state_dict()
    names_set = set(names)

    def model_items() -> Iterable[tuple[str, torch.Tensor]]:
        for k, v in sd.items():
            inside = any(k.startswith(n + ".") for n in names_set)
            for role, t in _legacy_items(k, v):
                yield (role if inside or role != "bias" else "other"), t

    return {"quantized_layers": _breakdown(layer_items, _serialized(layer_sd)),
            "model": _breakdown(model_items(), _serialized(sd))}


def bytes_by_role(quantized: nn.Module, names: Sequence[str],
                  graph: torch.fx.GraphModule | None = None) -> dict[str, Any]:
    """The breakdown of an int8 model, with what its format forces (``why``): PT2E's from its converted
    ``graph`` (:func:`lab.quant.pt2e.converted_graph`), a legacy model's (``graph`` None) from its modules."""
    if graph is not None:
        return {**graph_bytes_by_role(graph), "why": WHY_PT2E_FORMAT}
    return {**legacy_bytes_by_role(quantized, names), "why": WHY_LEGACY_FORMAT}


__all__ = ["bytes_by_role", "compact_int8_graph", "graph_bytes_by_role", "legacy_bytes_by_role", "ROLES",
           "size_bound", "WHY_LEGACY_FORMAT", "WHY_PT2E_FORMAT"]
