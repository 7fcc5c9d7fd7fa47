"""The ecosystem gallery (issue 27): Hugging Face models built from config objects (random init, nothing
downloaded) through every technique family. Each cell is ok *with its effect verified* (int8 layers present
and counted, sparsity measured, dtypes seen, channels and heads removed) or a refusal before training that
names the real reason. Skipped as a whole without the ``[hf]`` extra."""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import pytest
import torch
from torch import nn

pytest.importorskip("transformers", reason="the ecosystem gallery needs the [hf] extra (transformers)")

from lab.config import ComputeConfig, PrecisionConfig, PruneConfig, QuantConfig, RunConfig  # noqa: E402
from lab.loop import make_optimizer  # noqa: E402
from lab.pruning import channels, masks  # noqa: E402
from lab.quant import fair, int8, swap  # noqa: E402
from lab.train import run  # noqa: E402
from lab.workloads import hf  # noqa: E402

MODELS = ["BERT", "DISTILBERT", "GPT2", "VIT", "RESNET"]
TEXT = {"BERT", "DISTILBERT", "GPT2"}


def _setup(name: str, n: int = 48) -> tuple:
    wl = getattr(hf, name)()
    spec = dataclasses.replace(wl.size("tiny"), n_train=n, n_test=16)
    torch.manual_seed(0)
    return wl, wl.make_model(spec).eval(), wl.make_data(spec, 0)


def _inputs(data, rows: int = 8) -> tuple[torch.Tensor, ...]:
    return tuple(t[:rows] for t in data.train[:-1])


def _weight_layers(model: nn.Module) -> list[str]:
    """Every layer holding a float weight matrix: what an int8 method must either quantize or list as float."""
    return [n for n, m in model.named_modules() if n and (isinstance(m, nn.Linear | nn.Conv1d | nn.Conv2d)
                                                          or hf.is_conv1d(m))]


# ------------------------------------------------------------------------------------ adapter and data


@pytest.mark.parametrize("name", MODELS)
def test_adapter_returns_logits_on_deterministic_learnable_data(name):
    wl, model, data = _setup(name)
    again = wl.make_data(dataclasses.replace(wl.size("tiny"), n_train=48, n_test=16), 0)
    other = wl.make_data(dataclasses.replace(wl.size("tiny"), n_train=48, n_test=16), 1)
    assert all(torch.equal(a, b) for a, b in zip(data.train, again.train, strict=True))
    assert not torch.equal(data.train[0], other.train[0])
    out = model(*_inputs(data))
    assert isinstance(out, torch.Tensor)
    assert out.shape[0] == 8 and out.shape[-1] in (4, 64)
    assert torch.isfinite(wl.loss(out, data.train[-1][:8]))


def test_padding_is_masked_and_the_loss_is_the_hf_heads():
    wl, model, data = _setup("BERT")
    ids, mask = _inputs(data)
    assert (mask == 0).any(), "the synthetic streams carry padding"
    noisy = ids.clone()
    noisy[mask == 0] = 7  # change only padded tokens: a masked model does not see them
    torch.testing.assert_close(model(ids, mask), model(noisy, mask))
    labels = data.train[-1][:8]
    hf_loss = model.model(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(wl.loss(model(ids, mask), labels), hf_loss)
    wl, model, data = _setup("GPT2")
    ids, mask = _inputs(data)
    target = data.train[-1][:8]
    labels = torch.where(mask == 1, ids, torch.full_like(ids, hf.IGNORE))  # HF shifts the labels itself
    hf_loss = model.model(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(wl.loss(model(ids, mask), target), hf_loss)


def test_import_lab_never_needs_transformers():
    import subprocess
    import sys

    code = ("import sys, lab, lab.quant, lab.pruning, lab.workloads.hf; "
            "assert 'transformers' not in sys.modules, 'import lab pulled transformers in'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------ a lab run: precision, fused optim, masks


@pytest.mark.parametrize("name", MODELS)
def test_run_bf16_fused_optimizer_and_masks_show_their_effects(name):
    cfg = RunConfig(workload=f"lab.workloads.hf:{name}", size="tiny", threads=1, max_steps=4, warmup_steps=1,
                    latency_repeats=0, precision=PrecisionConfig(dtype="bf16"),
                    compute=ComputeConfig(fused_optimizer=True),
                    prune=PruneConfig(method="l1_unstructured", amount=0.5))
    r = run(cfg)
    assert r.status == "ok", r.error
    dtypes = r.details["precision"]["phases"]["train"]["layer_dtypes"]
    matmuls = [d for d in dtypes if d["type"] in ("Linear", "Conv1D", "Conv2d")]
    assert matmuls and all(d["output_dtype"] == "bfloat16" for d in matmuls), matmuls
    rec = r.details["pruning"]
    assert rec["sparsity_prunable"] == pytest.approx(0.5, abs=0.01)
    if name == "GPT2":  # the HF Conv1D layers carry the masks (lm_head is tied to the embedding: excluded)
        assert "model.lm_head.weight" in rec["excluded"]


@pytest.mark.parametrize("name", MODELS)
def test_fused_optimizer_is_fused(name):
    _, model, _ = _setup(name)
    opt = make_optimizer("adam", model.parameters(), 1e-3, fused=True)
    assert opt.defaults.get("fused") is True
    model(*_inputs(_setup(name)[2])).float().sum().backward()
    opt.step()  # a fused step runs on every parameter the HF model holds (one dtype, CPU)


def test_gpt2_conv1d_layers_take_masks():
    _, model, data = _setup("GPT2")
    targets = masks.prunable_weights(model, (), _inputs(data, 2))
    names = {n for n, _, _ in targets}
    conv1d = {n for n, m in model.named_modules() if hf.is_conv1d(m)}
    assert len(conv1d) == 8 and conv1d <= names
    masks.prune(model, PruneConfig(method="l1_unstructured", amount=0.5), example_inputs=_inputs(data, 2))
    for n in conv1d:
        w = model.get_submodule(n).weight
        assert float((w == 0).float().mean()) == pytest.approx(0.5, abs=0.01)


# ----------------------------------------------------------------- structured: channels, whole heads


@pytest.mark.parametrize("name", MODELS)
def test_structured_channels_remove_channels_and_keep_heads_whole(name):
    _, model, data = _setup(name)
    x = _inputs(data)
    if name == "GPT2":
        with pytest.raises(ValueError, match="Conv1D"):
            channels.prune_channels(model, 0.5, example_inputs=x)
        return
    before = sum(p.numel() for p in model.parameters())
    heads = {g.name: (g.heads, g.head_dim) for g in channels.attention_heads(model)}
    assert bool(heads) == (name != "RESNET")
    out = channels.prune_channels(model, 0.5, example_inputs=x)
    assert sum(p.numel() for p in model.parameters()) < before
    assert any(after < b for b, after in out.values()), out
    for g in channels.attention_heads(model):
        n0, d0 = heads[g.name]
        assert g.head_dim == d0 and g.heads == n0 // 2, "whole heads removed, head size kept"
        assert g.q.out_features == g.k.out_features == g.v.out_features == g.out.in_features == g.heads * d0
    assert model(*x).shape[-1] == 4


def test_hf_resnet_structured_pruning_recalibrates_batchnorm_and_recovers_in_one_epoch():
    """Issue 27: HF ResNet went 1.000 dense -> 0.82 after the fine-tune. Two causes, measured: BatchNorm kept the
    dense model's statistics (0.28 pruned; 0.75 once recalibrated) and 1 epoch at 0.1 x lr moved the weights too
    little (0.88; at 1 x lr: 0.996, now the default). The run recalibrates every BatchNorm and says when a
    fine-tune falls short."""
    cfg = RunConfig(workload="lab.workloads.hf:RESNET", size="tiny", threads=1, warmup_steps=1, latency_repeats=0,
                    prune=PruneConfig(method="structured_channels", amount=0.5, finetune_epochs=1))
    assert cfg.prune.finetune_lr_factor == 1.0  # the default since the measurement above (was 0.1)
    r = run(cfg)
    assert r.status == "ok", r.error
    rec = r.details["pruning"]
    n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in hf.RESNET().make_model(hf.RESNET().size("tiny")).modules())
    assert rec["batchnorm_recalibrated"] == n_bn > 0
    assert rec["metric_pruned"] >= rec["metric_pruned_stale_batchnorm"]
    assert rec["accuracy_loss_pt"] <= 3.0, rec  # the budget is 1 pt; margin for other CPUs' numerics


@pytest.mark.parametrize("name", ["BERT", "DISTILBERT", "VIT"])
def test_pruned_attention_equals_the_reference_restricted_to_kept_heads(name):
    _, model, data = _setup(name)
    groups = channels.attention_heads(model)
    g = groups[0]
    # the block holding q/k/v and the output projection: BERT / ViT's is the parent of .self, DistilBERT's itself
    inside = any(m is g.out for m in g.module.modules())
    block_name = g.name if inside else g.name.rpartition(".")[0]
    ref_model = copy.deepcopy(model)
    kept = channels.prune_heads([g], 0.5)[g.name]
    ref = next(r for r in channels.attention_heads(ref_model) if r.name == g.name)
    dropped = [h for h in range(ref.heads) if h not in kept]
    with torch.no_grad():  # the reference: the dense attention with the dropped heads' output columns silenced
        for h in dropped:
            ref.out.weight[:, h * ref.head_dim:(h + 1) * ref.head_dim] = 0
    hidden = torch.randn(3, 5, g.q.in_features)
    block, ref_block = model.get_submodule(block_name), ref_model.get_submodule(block_name)
    got, want = block(hidden), ref_block(hidden)
    got, want = (got[0] if isinstance(got, tuple) else got), (want[0] if isinstance(want, tuple) else want)
    assert len(kept) == 2 and g.q.out_features == 2 * ref.head_dim
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------- int8


@pytest.mark.parametrize("name", MODELS)
def test_legacy_dynamic_int8_quantizes_every_linear_or_lists_it(name):
    _, model, data = _setup(name)
    swap.check_model(model, "dynamic")
    q, info = int8.quantize_with_report(model, QuantConfig(method="dynamic", flow="legacy"))
    rep = info["swap"]
    assert rep["n_swapped"] > 0
    for layer in _weight_layers(model):
        assert layer in rep["swapped"] or rep["kept_float_reasons"].get(layer), f"{layer}: float and unlisted"
    if name == "GPT2":  # every Conv1D runs as an int8 Linear
        assert sorted(info["linearized"]["layers"]) == sorted(n for n, m in model.named_modules() if hf.is_conv1d(m))
        assert all(rep["swapped"].get(n) == "Linear" for n in info["linearized"]["layers"])
    x = _inputs(data)  # batch 8: HF BERT's expanded token_type_ids reach the int8 Embedding
    torch.testing.assert_close(q(*x), model(*x), rtol=0.3, atol=0.3)


@pytest.mark.parametrize("name", MODELS)
def test_legacy_static_int8_is_refused_before_training_naming_fx(name):
    _, model, _ = _setup(name)
    with pytest.raises(ValueError, match="FX symbolic tracing fails .*quant.flow='pt2e'"):
        int8.check_fx_traceable(model, "static")


# GPT-2 (Conv1D as Linear) and ResNet (convs: dynamic int8 keeps them float) differ by method, so both methods
# run on them; the encoders go through the same export and quantizer path, so each runs one method (BERT static:
# its int token_type_ids reach observers; DistilBERT dynamic; ViT static: its patch conv). All ten cost ~85 s of a
# 2-core CI's 15 minutes; these seven ~50 s with the flow's batch-1 Inductor compile, ~20 s as below. What is checked
# is the converted graph (int8 ops counted before any compile), so only two cases keep the compile (that Inductor
# lowers an int8 Linear graph, GPT-2 dynamic, and an int8 conv graph, ResNet static: a lowering that raises fails
# them); the others run the flow with torch.compile's stance at force_eager (the converted graph runs as is).
COMPILED = {("GPT2", "dynamic"), ("RESNET", "static")}


@pytest.mark.parametrize(("name", "method"), [
    *((n, m) for n in ("GPT2", "RESNET") for m in ("dynamic", "static")),
    *(pytest.param(n, m, marks=pytest.mark.slow) for n, m in (("BERT", "static"), ("DISTILBERT", "dynamic"),
                                                                ("VIT", "static")))])
def test_pt2e_int8_graph_holds_int8_layers(name, method):
    _, model, data = _setup(name)
    batches = [_inputs(data, 8), tuple(t[8:16] for t in data.train[:-1])]
    stance = contextlib.nullcontext() if (name, method) in COMPILED else torch.compiler.set_stance("force_eager")
    with stance:
        q, info = int8.quantize_with_report(model, QuantConfig(method=method, calibration_batches=2),
                                            iter([(*b, None) for b in batches]))
    rep = info["swap"]
    counts = rep["graph"]
    assert counts.get("int8_linear", 0) + counts.get("int8_conv", 0) == len(rep["swapped"]) > 0
    if name == "GPT2":  # the 8 Conv1D (as Linear) and the lm_head are int8 matmuls
        assert counts["int8_linear"] >= 9, counts
    share = fair.int8_macs(model, list(rep["swapped"]), _inputs(data, 1)) / max(1, _macs(model, _inputs(data, 1)))
    if name == "RESNET" and method == "dynamic":  # dynamic int8 has no conv kernel: only the classifier
        assert share < fair.MIN_INT8_MAC_SHARE
    else:
        assert share > fair.MIN_INT8_MAC_SHARE


def _macs(model: nn.Module, x: tuple) -> int:
    from lab import measure

    return measure.count_macs(model, x)


def test_compilation_credit_says_whose_gain_it_is():
    figures = {"theory": {"int8_mac_share": 0.01},
               "latency": {"batch_1": {"ratio": 1.1, "vs_fp32_compiled": {"ratio": 1.0}},
                           "batch_64": {"ratio": 2.3, "vs_fp32_compiled": {"ratio": 1.02}}}}
    line = fair.compilation_credit(figures)
    assert line.startswith("not an int8 speedup: the gain is compilation's") and "2.30x" in line and "1.02x" in line
    figures["theory"]["int8_mac_share"] = 0.6
    assert fair.compilation_credit(figures) is None


# ------------------------------------------------------------------------------------------ compile


@pytest.mark.slow
def test_compiled_and_eager_training_agree_with_dropout_off():
    base = dict(workload="lab.workloads.hf:BERT", size="tiny", threads=1, max_steps=3, warmup_steps=1,
                latency_repeats=0)
    eager = run(RunConfig(**base))
    compiled = run(RunConfig(**base, compute=ComputeConfig(compile=True)))
    assert compiled.status == "ok" and compiled.details["compute"]["graphs"] > 0
    torch.testing.assert_close(torch.tensor(compiled.losses[:3]), torch.tensor(eager.losses[:3]),
                               rtol=1e-4, atol=1e-4)


def test_bert_dropout_spec_draws_dropout_masks_and_bert_does_not():
    """BERT_DROPOUT is the spec compile's accuracy delta is measured on over seeds: its train-mode forwards draw
    masks (two calls differ), the gallery's BERT draws none (two calls are equal)."""
    for name, differs in (("BERT_DROPOUT", True), ("BERT", False)):
        _, model, data = _setup(name)
        x = _inputs(data)
        model.train()
        with torch.no_grad():
            a, b = model(*x), model(*x)
        assert (not torch.equal(a, b)) == differs, name
