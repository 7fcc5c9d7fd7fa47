"""What an int8 model stores (lab.quant.storage): PT2E stores its weight zero points as int8 and drops the fp32
weights convert_pt2e leaves unread, with outputs unchanged (also where a dequantize is not fused and lowers on its
own); the legacy format's fp64 scales / int64 zero points are reported by role, not hidden. Bytes and dtypes of
the stored tensors are checked, no timing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lab import quant as Q
from lab.config import QuantConfig
from lab.quant import pt2e as P


def _mlp() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16)).eval()
    g = torch.Generator().manual_seed(1)
    loader = [(torch.randn(32, 64, generator=g), torch.zeros(32, dtype=torch.long)) for _ in range(4)]
    return model, loader, torch.randn(64, 64, generator=g)


_BUILT: dict[tuple[str, bool], tuple[nn.Module, dict, nn.Module]] = {}


def _pt2e(method: str, compact: bool) -> tuple[nn.Module, dict, nn.Module]:
    """The PT2E int8 model of :func:`_mlp`'s model, compacted or as ``convert_pt2e`` left it, its report and the
    float model. Built once per module: the static storage test and the compiled-outputs test read the same two
    builds (each build compiles at batch 1, ~1-2 s), and neither changes them (the graphs are only called)."""
    if (method, compact) not in _BUILT:
        model, loader, _ = _mlp()
        with pytest.MonkeyPatch.context() as m:
            if not compact:
                m.setattr(P, "compact_int8_graph", lambda gm: {})
            q, info = Q.quantize_with_report(model, QuantConfig(method=method, calibration_batches=4), loader)
        _BUILT[method, compact] = (q, info, model)
    return _BUILT[method, compact]


def _check_roles(part: dict) -> None:
    assert sum(part[r] for r in Q.ROLES) == part["total"] and part["container"] >= 0


@pytest.mark.capability
@pytest.mark.parametrize("method", ["static", "dynamic"])
def test_pt2e_stores_no_unread_fp32_weights_with_outputs_unchanged(method):
    before, _, model = _pt2e(method, False)
    after, info, _ = _pt2e(method, True)
    x = _mlp()[2]
    g_before, g_after = Q.converted_graph(before), Q.converted_graph(after)
    with torch.no_grad():
        assert torch.equal(g_before(x), g_after(x))  # the same int8 computation, bit for bit
    sd = g_after.state_dict()
    assert not [k for k in sd if k.endswith("weight")]  # the unread fp32 copies (0.weight, 2.weight) are gone
    assert info["stored"]["zero_points_dropped"] == 0  # kept: an unfused dequantize needs them to lower
    assert info["stored"]["zero_points_as_int8"] == 2
    assert {"0.weight", "2.weight"} <= set(info["stored"]["unread_constants_deleted"])
    roles = Q.bytes_by_role(after, list(info["swap"]["swapped"]), g_after)
    layers = roles["quantized_layers"]
    _check_roles(layers)
    assert layers["zero_points"] == 128 + 16 and layers["dtypes"]["zero_points"] == ["int8"]  # 1 byte / channel
    assert layers["dtypes"]["int8_weights"] == ["int8"]
    assert layers["int8_weights"] == 64 * 128 + 128 * 16  # one byte per weight
    assert layers["scales"] == 4 * (128 + 16) and layers["dtypes"]["scales"] == ["float32"]
    assert layers["bias"] == 4 * (128 + 16)
    old = Q.bytes_by_role(before, list(info["swap"]["swapped"]), g_before)
    assert old["quantized_layers"]["zero_points"] == 8 * (128 + 16)  # what convert_pt2e stored: int64 zeros
    assert roles["model"]["total"] < old["model"]["total"] - 4 * (64 * 128 + 128 * 16)  # fp32 copies dropped
    f_l, q_l = Q.graph_layer_bytes(g_after)
    f_b, q_b = Q.graph_layer_bytes(g_before)
    assert f_l == f_b and q_b - q_l == 7 * (128 + 16)  # int64 -> int8 zero points: 7 bytes per channel saved
    with torch.no_grad():
        assert Q.relative_error(model(x), g_after(x)) < Q.error_bound(method, info["reduce_range"]["used"])


@pytest.mark.capability
@pytest.mark.slow
def test_compiled_compacted_int8_gives_the_same_outputs():
    before, _, _ = _pt2e("static", False)
    after, _, _ = _pt2e("static", True)
    x = _mlp()[2]
    assert torch.equal(before(x), after(x))  # Inductor fuses the same int8 kernels either way


def test_legacy_breakdown_reports_the_format_it_is_forced_to_store():
    model, loader, _ = _mlp()
    q, info = Q.quantize_with_report(model, QuantConfig(method="static", calibration_batches=4, flow="legacy"), loader)
    names = list(info["swap"]["swapped"])
    roles = Q.bytes_by_role(q, names)
    layers = roles["quantized_layers"]
    _check_roles(layers)
    _check_roles(roles["model"])
    assert layers["int8_weights"] == 64 * 128 + 128 * 16
    # per-channel weight qparams as torch.save writes them: fp64 scales, int64 zero points, per output channel
    assert layers["dtypes"]["scales"] == ["float32", "float64"] and "int64" in layers["dtypes"]["zero_points"]
    assert layers["scales"] >= 8 * (128 + 16) and layers["zero_points"] >= 8 * (128 + 16)
    assert "fp64" in roles["why"] and layers["total"] == Q.layer_bytes(model, q, names)[1]


@pytest.mark.capability
def test_int8_zero_points_lower_where_the_dequantize_is_not_fused(monkeypatch):
    """The shape that broke zero_points=None (a 16x8 Linear): compiled without freezing, Inductor lowers each
    dequantize_per_channel on its own, and int8 zero points give the int64 ones' outputs bit for bit."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8)).eval()
    loader = [(torch.randn(32, 16), torch.zeros(32, dtype=torch.long)) for _ in range(2)]
    x = torch.randn(32, 16)
    outs = {}
    for compact in (False, True):
        with monkeypatch.context() as m:
            if not compact:
                m.setattr(P, "compact_int8_graph", lambda gm: {})
            q, info = Q.quantize_with_report(model, QuantConfig(method="static", calibration_batches=2), loader)
        gm = Q.converted_graph(q)
        zps = [Q.attr_tensor(gm, n.args[1].args[2]) for n in Q.int8_weight_nodes(gm)]
        assert [z.dtype for z in zps] == [torch.int8 if compact else torch.int64]
        torch._dynamo.reset()
        with torch.no_grad():
            outs[compact] = (q(x), gm(x), torch.compile(gm)(x))
    assert all(torch.equal(a, b) for a, b in zip(outs[False], outs[True], strict=True))


def test_size_bound_is_what_per_channel_fp32_scales_and_biases_allow():
    assert Q.size_bound(311) == pytest.approx(3.9) and Q.size_bound(310) < 3.9  # k inputs per output channel
    assert Q.size_bound(64, zero_point_bytes=8) < Q.size_bound(64) < Q.size_bound(64, zero_point_bytes=0) < 4
