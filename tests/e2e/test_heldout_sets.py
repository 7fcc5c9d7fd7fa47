"""The doctor's held-out sets of models as people paste them, ``fresh`` (tests/gallery_fresh.py), ``third``
(tests/gallery_third.py), ``fourth`` (tests/gallery_fourth.py) and ``fifth`` (tests/gallery_fifth.py), are real
workloads: each model builds, trains a
few steps through ``lab.run`` by name with a finite loss and is evaluated, and each carries the pattern it is in
its set for, so a doctor score on them is a score on working models of those patterns. Cheap by design (a few
steps each; each set's learning was checked when it was built, 48 tiny steps each). No timing assertions."""

from __future__ import annotations

import math

import pytest
import torch
from gallery_fifth import (
    FIFTH,
    ClipClassifier,
    ConvNeXt,
    FNetBlock,
    GATNodeClassifier,
    GraphAttentionLayer,
    WaveformClassifier,
    register_fifth,
)
from gallery_fourth import (
    FOURTH,
    CrossAttentionBlock,
    LastTokenClassifier,
    LlamaAttention,
    PointCloudClassifier,
    STN3d,
    register_fourth,
)
from gallery_fresh import FRESH, KeywordSpotter, NextItem, register_fresh
from gallery_third import THIRD, ClickModel, NodeClassifier, TemporalBlock, VIBClassifier, register_third

from lab import RunConfig, run

#: set name -> (its models, a model whose data are checked to repeat)
SETS = {"fresh": (FRESH, "fresh_tabular"), "third": (THIRD, "third_dlrm"), "fourth": (FOURTH, "fourth_deepfm"),
        "fifth": (FIFTH, "fifth_gat")}


@pytest.fixture(scope="module", autouse=True)
def heldout_workloads():
    return register_fresh(), register_third(), register_fourth(), register_fifth()


@pytest.mark.parametrize("name", sorted(SETS))
def test_each_set_has_seven_models_none_shared_with_the_sets_before_it(name: str) -> None:
    from gallery import GALLERY
    from gallery_pasted import PASTED
    from gallery_unseen import UNSEEN

    models, _ = SETS[name]
    later = {"fresh": [], "third": [FRESH], "fourth": [FRESH, THIRD],
             "fifth": [FRESH, THIRD, FOURTH]}  # each set checked against every earlier one
    before = [GALLERY, UNSEEN, PASTED, *later[name]]
    assert len(models) == 7 and all(n.startswith(f"{name}_") for n in models)
    mine = {type(w.make_model(w.size("tiny"))).__name__ for w in models.values()}
    others = {type(w.make_model(w.size("tiny"))).__name__ for s in before for w in s.values()}
    assert len(mine) == 7 and not mine & others, mine & others


@pytest.mark.parametrize("name", sorted([*FRESH, *THIRD, *FOURTH, *FIFTH]))
def test_each_model_trains_a_few_steps_through_the_lab(name: str) -> None:
    r = run(RunConfig(workload=name, size="tiny", threads=1, max_steps=2, warmup_steps=1, latency_repeats=0))
    assert r.status == "ok" and r.error is None, (name, r.error)
    assert r.workload == name and r.param_count > 0 and r.steps == 2
    assert len(r.losses) == 2 and all(math.isfinite(x) for x in r.losses), r.losses
    assert r.metric_name == "accuracy" and r.metric is not None and 0.0 <= r.metric <= 1.0


@pytest.mark.parametrize("name", sorted(SETS))
def test_the_data_are_generated_not_downloaded_and_repeat(name: str) -> None:
    models, which = SETS[name]
    wl = models[which]
    a, b = wl.make_data(wl.size("tiny"), 0), wl.make_data(wl.size("tiny"), 0)
    assert torch.equal(a.train[0], b.train[0]) and torch.equal(a.train[1], b.train[1])


def test_the_fresh_patterns_are_there() -> None:
    """A transposed-view buffer, a tied table."""
    kws = KeywordSpotter()
    assert not kws.basis.is_contiguous()
    tower = NextItem().model
    assert tower.history.weight is tower.item_emb.weight


def test_the_third_patterns_are_there() -> None:
    """The graph as buffers, a weight-normed conv, a (logits, loss) tuple whose sampling differs between train
    and eval, ids read as integers in forward."""
    gcn = NodeClassifier()
    assert {n for n, _ in gcn.named_buffers()} == {"features", "adj"}
    assert torch.allclose(gcn.adj, gcn.adj.t())  # the symmetric normalisation D^-1/2 (A + I) D^-1/2
    block = TemporalBlock(2, 4, 3, stride=1, dilation=2, padding=4)
    assert torch.nn.utils.parametrize.is_parametrized(block.conv1, "weight")
    vib, x = VIBClassifier(), torch.randn(8, 64)
    logits, loss = vib(x, torch.zeros(8, dtype=torch.long))
    assert logits.shape == (8, 6) and loss is not None and vib(x)[1] is None
    assert not torch.equal(vib(x)[0], vib(x)[0])  # reparameterised: a fresh eps every training call
    vib.eval()
    assert torch.equal(vib(x)[0], vib(x)[0])  # the mean in eval
    wl = THIRD["third_dlrm"]
    table = wl.make_data(wl.size("tiny"), 0).train[0][:4]
    assert table.dtype == torch.float32 and ClickModel()(table).shape == (4, 1)


def test_the_fourth_patterns_are_there() -> None:
    """A tied embedding and a ``(logits, loss)`` tuple (the last position alone without targets) over a fused qkv
    projection, a T-Net whose identity is made in forward and applied by ``bmm``, a sequence-first
    ``nn.MultiheadAttention`` cross-attention, long ids in for DeepFM."""
    llama = LastTokenClassifier().llama
    assert llama.tok_embeddings.weight is llama.output.weight
    attn = llama.layers[0].attention
    assert isinstance(attn, LlamaAttention) and attn.wqkv.out_features == 3 * attn.wqkv.in_features
    assert {n for n, _ in llama.named_buffers()} == {"freqs_cos", "freqs_sin"} and not llama.state_dict().keys() & {
        "freqs_cos", "freqs_sin"}  # non-persistent
    tokens = torch.randint(0, 32, (4, 24))
    logits, loss = llama(tokens, tokens)
    assert logits.shape == (4, 24, 32) and loss is not None and loss.ndim == 0
    logits, loss = llama(tokens)
    assert logits.shape == (4, 1, 32) and loss is None
    stn = STN3d()
    for p in stn.fc3.parameters():
        torch.nn.init.zeros_(p)
    stn.eval()
    assert torch.equal(stn(torch.randn(2, 3, 16)), torch.eye(3).expand(2, 3, 3))  # the identity made in forward
    net = PointCloudClassifier()
    assert net(torch.randn(5, 64, 3)).shape == (5, 3)
    cross = CrossAttentionBlock(64, 64)
    assert isinstance(cross.attn, torch.nn.MultiheadAttention) and not cross.attn.batch_first
    perceiver = FOURTH["fourth_perceiver"].make_model(None)
    assert all(not layer.self_attn.batch_first for layer in perceiver.self_attends)
    wl = FOURTH["fourth_deepfm"]
    ids = wl.make_data(wl.size("tiny"), 0).train[0][:4]
    assert ids.dtype == torch.long and wl.make_model(None)(ids).shape == (4,)


def test_the_fifth_patterns_are_there() -> None:
    """ConvNeXt's depthwise 7 x 7 conv and layer-scale parameter, pyGAT's dense-adjacency mask over graph buffers,
    WaveNet's causal (left-padded) dilations, FNet's parameter-free Fourier mixing, ConvLSTM's state lists."""
    block = ConvNeXt().stages[0][0]
    assert block.dwconv.groups == block.dwconv.in_channels == block.dwconv.out_channels
    assert block.dwconv.kernel_size == (7, 7) and isinstance(block.gamma, torch.nn.Parameter)
    gat = GATNodeClassifier()
    assert {n for n, _ in gat.named_buffers()} == {"features", "adj"}
    assert sum(n.startswith("attention_") for n, _ in gat.gat.named_children()) == 4  # heads added by add_module
    layer, h = GraphAttentionLayer(5, 3, dropout=0.0, alpha=0.2, concat=False), torch.randn(4, 5)
    assert torch.allclose(layer(h, torch.eye(4)), h @ layer.W)  # a self-loop alone: all attention masked but self
    assert not torch.allclose(layer(h, torch.ones(4, 4)), h @ layer.W)
    wavenet, x = WaveformClassifier().wavenet.eval(), torch.randn(2, 1, 64)
    later = x.clone()
    later[..., 40:] = torch.randn(2, 1, 24)
    out, out_later = wavenet(x), wavenet(later)
    assert torch.allclose(out[..., :40], out_later[..., :40], atol=1e-6)  # causal: no output sees a later input
    assert not torch.allclose(out, out_later)
    tokens = torch.randn(3, 8, 6)
    assert not list(FNetBlock().parameters())
    assert torch.allclose(FNetBlock()(tokens), torch.fft.fftn(tokens, dim=(-2, -1)).real, atol=1e-5)
    convlstm = ClipClassifier().convlstm
    outputs, states = convlstm(torch.randn(2, 5, 1, 8, 8))
    assert len(outputs) == len(states) == 1 and outputs[0].shape == (2, 5, 16, 8, 8)
    assert torch.equal(outputs[0][:, -1], states[0][0])  # the last output is the last hidden state
    wl = FIFTH["fifth_capsnet"]
    lengths = wl.make_model(None)(wl.make_data(wl.size("tiny"), 0).train[0][:4])
    assert lengths.shape == (4, 4) and bool(((lengths >= 0) & (lengths < 1)).all())  # squashed capsule lengths
