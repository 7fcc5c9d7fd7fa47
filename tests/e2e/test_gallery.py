"""Every technique family on user models built from standard blocks (tests/gallery.py): each either works,
with its effect verified from the run record, or is refused by ``lab.run`` before any training step, with
a one-line reason. Never a crash, never a silent no-op. No timing assertions."""

from __future__ import annotations

import copy

import pytest
import torch
from gallery import GALLERY, TokenTransformer, register_gallery
from matrix import run_cell
from torch import nn

from lab import RunConfig, measure, run
from lab.config import PruneConfig, QuantConfig
from lab.pruning import make_permanent, prune
from lab.quant import quantize, quantize_with_report
from lab.workloads import Datasets, SizeSpec, Workload, register_workload

TECHNIQUES: dict[str, dict] = {
    "l1_finetune": {"prune.method": "l1_unstructured", "prune.amount": 0.5, "prune.finetune_epochs": 1},
    "global": {"prune.method": "global_unstructured", "prune.amount": 0.5},
    "gradual": {"prune.method": "l1_unstructured", "prune.amount": 0.5, "prune.schedule": "gradual"},
    "structured": {"prune.method": "structured_channels", "prune.amount": 0.5, "prune.finetune_epochs": 1},
    "dynamic": {"quant.method": "dynamic", "quant.flow": "legacy"},
    "static": {"quant.method": "static", "quant.flow": "legacy"},
    "qat": {"quant.method": "qat", "quant.flow": "legacy"},
    "bf16": {"precision.dtype": "bf16"},
    "fused_optimizer": {"compute.fused_optimizer": True},
    "grad_accum": {"ddp.grad_accum_steps": 2},
}
#: (model, technique) -> words the one-line refusal must contain (why, not just "no").
REFUSED: dict[tuple[str, str], tuple[str, ...]] = {
    ("gallery_gru", "structured"): ("no structurally prunable layer", "gru: hidden units span the gate blocks",
                                    "head: the output layer"),
}
ENCODER_LINEARS = [f"encoder.layers.{i}.{n}" for i in (0, 1) for n in ("linear1", "linear2")]


@pytest.fixture(scope="module", autouse=True)
def gallery_workloads():
    return register_gallery()


def _cfg(model: str, overrides: dict) -> RunConfig:
    return RunConfig(workload=model, size="tiny", threads=1, latency_repeats=2).with_overrides(**overrides)


# ------------------------------------------------------------------------------------- verifications

def _verify_prune(r, model: str, technique: str) -> None:
    d = r.details["pruning"]
    if technique == "structured":
        shrunk = {n: bw for n, bw in d["channels"].items() if bw[1] < bw[0]}
        assert shrunk, d["channels"]
        assert r.param_count < d["params_dense"] and d["macs_per_sample"] < d["macs_per_sample_dense"]
        assert d["macs_ratio"] > 1.1
        if model == "gallery_transformer":  # the feed-forward shrinks; attention is excluded, saying why
            assert set(shrunk) == {"encoder.layers.0.linear1", "encoder.layers.1.linear1"}
            assert "not by heads" in d["excluded"]["encoder.layers.0.self_attn"]
            assert "residual" in d["excluded"]["encoder.layers.1.linear2"]
        if model == "gallery_dscnn":  # the depthwise conv and the SE gate follow the channels they touch
            assert {"depthwise.0", "se.fc2"} <= set(shrunk)
        return
    assert d["sparsity_prunable"] == pytest.approx(0.5, abs=0.01)
    assert r.nonzero_params < r.param_count
    assert all(0 <= rec["sparsity"] <= 1 for rec in d["layers"].values())
    if technique != "global":  # per-layer methods hit every targeted weight
        assert all(rec["sparsity"] == pytest.approx(0.5, abs=0.02) for rec in d["layers"].values()), d["layers"]
    if technique == "l1_finetune":
        assert d["finetune"]["steps"] > 0 and "metric_finetuned" in d
    if technique == "gradual":
        assert d["schedule_history"] and d["schedule_history"][-1][1] == pytest.approx(0.5)
    if model == "gallery_transformer":  # the attention projections are really masked
        for i in (0, 1):
            assert f"encoder.layers.{i}.self_attn.in_proj_weight" in d["layers"]
            assert f"encoder.layers.{i}.self_attn.out_proj.weight" in d["layers"]
        if technique != "global":
            assert d["layers"]["encoder.layers.0.self_attn.out_proj.weight"]["sparsity"] == pytest.approx(0.5)
    if model == "gallery_tied":  # the tied head is left out, with the reason; the shared block is pruned
        assert "weight tying" in d["excluded"]["head.weight"] and "head.weight" not in d["layers"]
        assert {"block.0.weight", "block.2.weight"} <= set(d["layers"])


def _verify_quant(r, model: str, technique: str) -> None:
    q = r.details["quant"]
    swap = q["swap"]
    assert swap["n_swapped"] >= 1 and q["method"] == technique
    assert set(swap["kept_float_reasons"]) == set(swap["kept_float"])
    assert all(reason and "\n" not in reason for reason in swap["kept_float_reasons"].values())
    assert q["int8_model_macs_by_dtype"]["int8"] > 0  # int8 kernels really run, and are counted
    assert r.macs_per_sample > 0
    if model == "gallery_transformer":
        reasons = swap["kept_float_reasons"]
        if technique == "dynamic":
            assert set(ENCODER_LINEARS) <= set(swap["swapped"])
            assert set(q["fastpath"]["unfused_layers"]) == {"encoder.layers.0", "encoder.layers.1"}
            assert "MultiheadAttention" in reasons["encoder.layers.0.self_attn.out_proj"]
        else:  # FX cannot trace the encoder: each of its layers says so
            assert set(ENCODER_LINEARS) <= set(swap["kept_float"])
            assert all("FX graph mode" in reasons[n] for n in ENCODER_LINEARS)
            assert {"embed", "head"} <= set(swap["swapped"])
    if model == "gallery_dscnn":
        if technique == "dynamic":
            assert "no convolution kernel" in swap["kept_float_reasons"]["depthwise.0"]
        else:
            assert {"stem.0", "depthwise.0", "pointwise.0", "se.fc1", "se.fc2", "fc"} <= set(swap["swapped"])
    if model == "gallery_gru":
        if technique == "dynamic":
            assert swap["swapped"]["gru"] == "GRU"
        else:
            assert "GRU kernel" in swap["kept_float_reasons"]["gru"]


def _verify_other(r, model: str, technique: str) -> None:
    if technique == "bf16":
        layers = r.details["precision"]["phases"]["train"]["layer_dtypes"]
        assert any(rec["type"] in ("Linear", "Conv2d") and rec["output_dtype"] == "bfloat16" for rec in layers)
        if model == "gallery_transformer":
            attn = [rec for rec in layers if rec["type"] == "MultiheadAttention"]
            assert len(attn) == 2 and all(rec["output_dtype"] == "bfloat16" for rec in attn)
        if model == "gallery_gru":  # CPU autocast has no bf16 rule for GRU: said, not hidden
            assert r.details["precision"]["phases"]["train"]["untouched_by_autocast"] == {"gru": "GRU"}
            assert any("left gru (GRU) in fp32" in w for w in r.why)
    elif technique == "fused_optimizer":
        assert r.details["steps"]["train"]["fused"] is True
    elif technique == "grad_accum":
        d = r.details["distributed"]
        assert d["grad_accum_steps"] == 2 and d["effective_batch"] == 2 * d["per_rank_batch"]


@pytest.mark.parametrize("technique", list(TECHNIQUES))
@pytest.mark.parametrize("model", list(GALLERY))
def test_every_technique_works_or_is_refused_before_training(model, technique):
    r = run_cell(_cfg(model, TECHNIQUES[technique]), REFUSED.get((model, technique)))
    if r is None:  # refused before training, as REFUSED says
        return
    assert r.status == "ok" and r.steps > 0 and r.metric == r.metric  # not NaN
    assert r.metric > r.metric_before or r.metric > 0.8, (r.metric_before, r.metric)  # it learned
    if model == "gallery_transformer":  # counted through the fused attention path, int8 included
        assert r.macs_per_sample > r.param_count
    family = technique if technique in ("dynamic", "static", "qat") else (
        "prune" if "prune.method" in TECHNIQUES[technique] else "other")
    {"prune": _verify_prune, "other": _verify_other}.get(family, _verify_quant)(r, model, technique)


@pytest.mark.slow
def test_compile_on_a_user_model():  # the MLP: a cold inductor compile of the Transformer alone takes ~40 s here
    r = run(_cfg("gallery_mlp", {"compute.compile": True}))
    assert r.status == "ok" and r.details["steps"]["train"]["compiled"] is True and r.metric > 0.8


# ------------------------------------------------------------------------------------ refusals


def test_naming_a_tied_weight_is_refused_before_training():
    events: list[dict] = []
    cfg = _cfg("gallery_tied", {"prune.method": "l1_unstructured", "prune.amount": 0.5, "prune.layers": ("head",)})
    with pytest.raises(ValueError, match=r"head\.weight.*same Parameter as embed\.weight \(weight tying\)"):
        run(cfg, progress=events.append)
    assert not events


class AllConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 10, 1),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_dynamic_int8_of_a_model_without_linears_is_refused_before_training():
    def data(spec: SizeSpec, seed: int) -> Datasets:
        x = torch.randn(96, 1, 8, 8, generator=torch.Generator().manual_seed(seed))
        y = (x.mean((1, 2, 3)) > 0).long()
        return Datasets(train=(x[:64], y[:64]), test=(x[64:], y[64:]))

    spec = SizeSpec(n_train=64, n_test=32, batch_size=16, epochs=1, lr=1e-2)
    register_workload(Workload(name="gallery_allconv", description="convolutions only",
                               sizes={"tiny": spec, "small": spec, "full": spec}, make_data=data,
                               make_model=lambda s: AllConv(), loss=nn.functional.cross_entropy,
                               evaluate=GALLERY["gallery_mlp"].evaluate, metric_name="accuracy"), overwrite=True)
    events: list[dict] = []
    with pytest.raises(ValueError, match="would quantize nothing.*no convolution kernel") as err:
        run(_cfg("gallery_allconv", {"quant.method": "dynamic", "quant.flow": "legacy"}), progress=events.append)
    assert "\n" not in str(err.value) and not events
    static = run(_cfg("gallery_allconv", {"quant.method": "static", "quant.flow": "legacy"}))
    assert static.details["quant"]["swap"]["n_swapped"] == 2


# ------------------------------------------------------------------------------- attention masks


def _tokens(n: int = 8) -> tuple[torch.Tensor]:
    return (torch.randint(0, 12, (n, 16), generator=torch.Generator().manual_seed(0)),)


def test_attention_masks_apply_in_training_and_evaluation():
    torch.manual_seed(0)
    model = TokenTransformer()
    x = _tokens()
    prune(model, PruneConfig(method="l1_unstructured", amount=0.5), example_inputs=x)
    attn = model.encoder.layers[0].self_attn
    with torch.no_grad():  # what an optimizer step does: the originals move, the masks stay
        for module, name in ((attn, "in_proj_weight"), (attn.out_proj, "weight")):
            getattr(module, name + "_orig").add_(torch.randn_like(getattr(module, name + "_orig")))
    with torch.no_grad():  # recompute the masked weights without a graph, so the model can be copied
        model.eval()(*x)
    baked = make_permanent(copy.deepcopy(model))  # weights = orig * mask as plain parameters
    assert float((baked.encoder.layers[0].self_attn.out_proj.weight == 0).float().mean()) == pytest.approx(0.5)
    for train in (True, False):
        model.train(train)
        baked.train(train)
        with torch.no_grad():
            assert torch.allclose(model(*x), baked(*x), atol=1e-5), f"train={train}"
    model.train()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(2):  # the bug: out_proj's masked weight was computed once, its graph reused across steps
        opt.zero_grad()
        model(*x).sum().backward()
        opt.step()
    assert attn.out_proj.weight_orig.grad is not None
    assert torch.all(attn.out_proj.weight[attn.out_proj.weight_mask == 0] == 0)


# --------------------------------------------------------------------------------------------- MACs


def test_transformer_macs_count_through_the_fused_path_and_match_the_formula():
    model = TokenTransformer().eval()
    (x,) = _tokens(1)
    d, s, ff = 32, 16, 64
    per_layer = s * (3 * d * d + d * d + 2 * d * ff) + 2 * s * s * d  # projections + QK^T + AV
    expected = 2 * per_layer + d * 4
    before = torch.backends.mha.get_fastpath_enabled()
    assert measure.count_macs(model, (x,)) == expected
    assert torch.backends.mha.get_fastpath_enabled() == before  # restored
    assert measure.weights_used_per_sample_guard(model, expected) is None
    assert "undercounted" in measure.weights_used_per_sample_guard(model, 128)  # the reported bug's figure


def test_int8_macs_are_counted_by_dtype():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 2)).eval()
    x = torch.randn(4, 30)
    macs = 4 * (30 * 64 + 64 * 2)
    assert measure.count_macs_by_dtype(mlp, (x,)) == {"fp32": macs, "int8": 0}
    q = quantize(mlp, QuantConfig(method="dynamic", flow="legacy"))
    assert measure.count_macs_by_dtype(q, (x,)) == {"fp32": 0, "int8": macs}
    assert measure.count_macs(q, (x,)) == macs
    cnn = GALLERY["gallery_dscnn"].make_model(GALLERY["gallery_dscnn"].sizes["tiny"]).eval()
    img = torch.rand(2, 1, 8, 8)
    dense = measure.count_macs(cnn, (img,))
    qs = quantize(cnn, QuantConfig(method="static", flow="legacy"), [(img, torch.zeros(2, dtype=torch.long))])
    assert measure.count_macs_by_dtype(qs, (img,)) == {"fp32": 0, "int8": dense}
    qd, info = quantize_with_report(cnn, QuantConfig(method="dynamic", flow="legacy"))
    by = measure.count_macs_by_dtype(qd, (img,))
    assert by["int8"] == 2 * (48 * 12 + 12 * 48 + 48 * 10) and by["fp32"] + by["int8"] == dense


@pytest.mark.parametrize("name", list(GALLERY))
def test_gallery_macs_are_not_below_the_weights_a_sample_uses(name):
    wl = GALLERY[name]
    model = wl.make_model(wl.sizes["tiny"]).eval()
    one = tuple(t[:1] for t in wl.make_data(wl.sizes["tiny"], 0).test[:-1])
    macs = measure.count_macs(model, one)
    assert macs >= measure.weights_used_per_sample(model) > 0
    assert measure.weights_used_per_sample_guard(model, macs) is None
