"""The plain-PyTorch reference (issue 15): its arms are what they say (half the width, quantized Linear
layers, bf16 matmuls), and a tiny real comparison on the mlp ladder has one row per technique x axis with
intervals that contain their estimates (structure only: no timing assertion)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lab.crossover import build_map
from lab.crossover.arms import INFER, TRAIN
from lab.crossover.measure import make_bench
from lab.crossover.reference import compare, half_width, plain_arms
from lab.crossover.report import reference_figures
from lab.workloads import get_workload


def _bench():
    return make_bench(get_workload("mlp"), "xs", batch_size=8)


def test_half_width_halves_every_hidden_layer_and_keeps_the_ends() -> None:
    model = nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    half = half_width(model)
    shapes = [(m.in_features, m.out_features) for m in half if isinstance(m, nn.Linear)]
    assert shapes == [(256, 32), (32, 32), (32, 10)]
    assert half(torch.randn(3, 256)).shape == (3, 10)
    with pytest.raises(ValueError, match="nn.Linear"):
        half_width(nn.Sequential(nn.ReLU()))


def test_plain_arms_run_bf16_int8_and_leave_the_benchs_model_alone() -> None:
    bench = _bench()
    before = {k: v.clone() for k, v in bench.model.state_dict().items()}
    train = plain_arms(bench, TRAIN)
    assert set(train) == {"plain_base", "plain_bf16", "plain_prune_channels50", "plain_fb_base", "plain_fb_bf16",
                          "plain_bf16+fused_optim"}
    for arm in train.values():
        arm()
    assert all(torch.equal(before[k], v) for k, v in bench.model.state_dict().items())  # copies trained
    dtypes: set[torch.dtype] = set()
    kinds: set[str] = set()

    def record(mod: nn.Module, args: tuple, out: object) -> None:
        kinds.add(type(mod).__module__ + "." + type(mod).__name__)
        if isinstance(mod, nn.Linear) and isinstance(out, torch.Tensor):
            dtypes.add(out.dtype)

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        infer = plain_arms(bench, INFER)
        infer["plain_bf16"]()
        assert torch.bfloat16 in dtypes  # autocast really ran the Linear layers in bf16
        kinds.clear()
        infer["plain_int8_eager"]()
    finally:
        hook.remove()
    assert any(".quantized.dynamic" in k for k in kinds), kinds  # the int8 arm calls dynamic int8 Linear layers


def test_a_tiny_real_comparison_has_a_row_per_technique_and_axis() -> None:
    rows = compare(_bench(), repeats=3, block_ms=1.0, rung="xs")
    got = {(r["technique"], r["axis"]) for r in rows}
    assert got == {("bf16", TRAIN), ("prune_channels50", TRAIN), ("bf16", INFER), ("int8_eager", INFER),
                   ("prune_channels50", INFER), ("bf16", "forward_backward"), ("bf16+fused_optim", TRAIN)}
    for r in rows:
        assert r["plain_lo"] <= r["plain"] <= r["plain_hi"]
        if r["lab"] is not None:
            assert r["lab_lo"] <= r["lab"] <= r["lab_hi"] and isinstance(r["agrees"], bool)
    prune = next(r for r in rows if r["technique"] == "prune_channels50" and r["axis"] == TRAIN)
    assert prune["macs_ratio"] > 1.5 and prune["target"] == pytest.approx(0.75 * prune["macs_ratio"])
    figs = reference_figures(rows)
    assert any(f["goal"] == "95 % intervals overlap" for f in figs)
    with pytest.raises(ValueError, match="single-input"):
        compare(make_bench(get_workload("ctr"), "xs", batch_size=8), repeats=3)


def test_a_map_with_the_mlp_ladder_carries_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from lab.crossover import mapping

    seen = []  # the real comparison is timed above; here only which bench the map hands it
    monkeypatch.setattr(mapping, "compare_with_plain",
                        lambda bench, **kw: seen.append((bench, kw)) or [{"rung": kw["rung"]}])
    the_map = build_map(["mlp"], ["bf16"], rungs={"mlp": ["xs", "s"]}, repeats=3, batch_size={"mlp": 8})
    assert the_map["reference"] == [{"rung": "s"}]  # the largest measured rung
    (bench, kw), = seen
    assert bench.batch_size == 8 and kw["rung"] == "s" and bench.workload.name == "mlp"
    assert build_map(["sequence"], ["bf16"], rungs={"sequence": ["xs", "s"]}, repeats=3,
                     batch_size={"sequence": 8})["reference"] == []


def test_reference_figure_draws_both_sides_with_whiskers_and_the_targets() -> None:
    from lab.plots.scale import reference_figure

    rows = [{"rung": "xl", "technique": "bf16", "axis": TRAIN, "lab": 1.3, "lab_lo": 1.1, "lab_hi": 1.5,
             "plain": 1.2, "plain_lo": 0.9, "plain_hi": 1.3, "agrees": True, "target": 1.8},
            {"rung": "xl", "technique": "bf16", "axis": "forward_backward", "lab": None, "lab_lo": None,
             "lab_hi": None, "plain": 2.0, "plain_lo": 1.5, "plain_hi": 2.5, "agrees": None, "target": None}]
    fig = reference_figure(rows)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == ["lab", "plain PyTorch"]
    assert list(bars[1].y) == [1.2, 2.0] and list(bars[1].error_y.array) == pytest.approx([0.1, 0.5])
    (target,) = [t for t in fig.data if t.name == "target"]
    assert list(target.y) == [1.8]
