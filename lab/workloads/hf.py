"""Hugging Face Transformers models as lab workloads: a thin adapter, deterministic synthetic data per task,
and a gallery of tiny models built from config objects (random init, nothing downloaded).

Why an adapter: a HF model takes keyword tensors (``input_ids``, ``attention_mask``, ``pixel_values``) and
returns a ``ModelOutput``; the lab calls ``model(*inputs)`` on a tuple batch and wants one tensor.
:class:`HFAdapter` maps the tuple onto the keywords of its task and returns ``ModelOutput.logits``; the lab's
loss is computed from those logits (the same cross-entropy the HF head computes from ``labels``: a test holds
them equal), so the techniques see a plain ``nn.Module`` around the HF model, its layers where they were.

``workload(model_factory, task=...)`` builds a :class:`~lab.workloads.base.Workload`:

- ``sequence_classification``: ``(input_ids, attention_mask, label)``; right-padded token streams whose class
  is the one marker token planted among the real tokens (chance ``1 / n_classes``); padding is masked out.
- ``causal_lm``: ``(input_ids, attention_mask, next_tokens)``; each stream follows a planted bigram rule (a
  fixed permutation of the vocabulary); targets are the next tokens, ``-100`` on padding and the last token;
  scored by next-token accuracy (chance ``1 / vocab``).
- ``image_classification``: ``(pixel_values, label)``; noise images whose class is their brighter quadrant.

``transformers`` is the optional extra ``[hf]``: this module imports it only inside the gallery's model
factories, so ``import lab`` never needs it. The gallery (:data:`GALLERY`: BERT, DistilBERT, GPT-2, ViT, HF
ResNet) is loaded by spec, e.g. ``--workload lab.workloads.hf:BERT`` (registered as ``hf_bert``). Dropout is
off in the gallery's configs (short runs, and compiled vs eager training then draw no RNG: docs/workloads.md);
``:BERT_DROPOUT`` keeps HF's default 0.1, for measuring compile's accuracy delta over seeds.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .base import Datasets, SizeSpec, Workload

TASKS = ("sequence_classification", "causal_lm", "image_classification")
#: Target value the losses and metrics skip (the HF / PyTorch convention).
IGNORE = -100
#: Token ids the sequence task reserves: padding, a leading [CLS]-like token; the markers follow them.
PAD, CLS = 0, 1
_N_RESERVED = 2


def is_conv1d(module: nn.Module) -> bool:
    """A Hugging Face ``transformers.pytorch_utils.Conv1D`` (GPT-2 style: ``y = x @ W + b`` with the weight
    stored ``[in_features, out_features]``, ``nf`` outputs), recognised by type name and shape without importing
    transformers; the quantization and pruning families read HF layers through this one test."""
    w = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(w, torch.Tensor) and w.dim() == 2
            and getattr(module, "nf", None) == w.shape[1])


def logits_of(out: Any) -> torch.Tensor:
    """The logits tensor of a model's output: a tensor itself, ``ModelOutput.logits`` or ``out["logits"]``."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, dict):
        logits = out.get("logits")
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"the model returned {type(out).__name__} without a logits tensor")
    return logits


class HFAdapter(nn.Module):
    """``forward(*inputs) -> logits`` around a HF model: the lab's tuple batch as the task's keywords.

    The HF model is the child ``model``, so layer paths read ``model.bert.encoder.layer.0...``."""

    def __init__(self, model: nn.Module, task: str) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task={task!r} is invalid: allowed: {', '.join(TASKS)}")
        self.model = model
        self.task = task

    def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        # named arguments, not *inputs: torch.export matches dynamic shapes to the signature's parameters
        if self.task == "image_classification":
            return logits_of(self.model(pixel_values=inputs))
        return logits_of(self.model(input_ids=inputs, attention_mask=attention_mask))


# ---------------------------------------------------------------------------------------------- data


def _rng(seed: int, salt: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, salt]))


def _lengths(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return rng.integers(max(3, seq_len // 2), seq_len + 1, size=n)


def _mask(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    return (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int64)


def make_sequences(n: int, *, seed: int, seq_len: int = 16, vocab: int = 64, n_classes: int = 4
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``input_ids`` [n, seq_len], ``attention_mask`` [n, seq_len] and labels [n]: ``CLS``, then real tokens
    (noise ids) holding one marker ``2 + label`` at a random position, then ``PAD`` (mask 0)."""
    if vocab < _N_RESERVED + n_classes + 2:
        raise ValueError(f"vocab={vocab} is invalid: needs >= {_N_RESERVED + n_classes + 2} (reserved, markers, noise)")
    rng = _rng(seed, 27)
    y = rng.permutation(np.arange(n) % n_classes).astype(np.int64)
    lengths = _lengths(rng, n, seq_len)
    x = rng.integers(_N_RESERVED + n_classes, vocab, size=(n, seq_len), dtype=np.int64)
    x[:, 0] = CLS
    where = 1 + (rng.random(n) * (lengths - 1)).astype(np.int64)
    x[np.arange(n), where] = _N_RESERVED + y
    mask = _mask(lengths, seq_len)
    x[mask == 0] = PAD
    return x, mask, y


def make_bigram_streams(n: int, *, seed: int, seq_len: int = 16, vocab: int = 64
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``input_ids``, ``attention_mask`` and next-token targets [n, seq_len]: each stream starts at a random
    token and follows a planted permutation of the vocabulary (``x[t + 1] = perm[x[t]]``); targets are
    ``IGNORE`` on padding and on the last real token."""
    rng = _rng(seed, 28)
    perm = rng.permutation(np.arange(1, vocab))  # token 0 is padding
    nxt = np.zeros(vocab, dtype=np.int64)
    nxt[1:] = perm
    lengths = _lengths(rng, n, seq_len)
    x = np.zeros((n, seq_len), dtype=np.int64)
    x[:, 0] = rng.integers(1, vocab, size=n)
    for t in range(1, seq_len):
        x[:, t] = nxt[x[:, t - 1]]
    mask = _mask(lengths, seq_len)
    x[mask == 0] = PAD
    target = np.full((n, seq_len), IGNORE, dtype=np.int64)
    target[:, :-1] = np.where(mask[:, 1:] == 1, x[:, 1:], IGNORE)
    return x, mask, target


def make_images(n: int, *, seed: int, image_size: int = 16, channels: int = 3
                ) -> tuple[np.ndarray, np.ndarray]:
    """``pixel_values`` [n, channels, size, size] float32 (unit noise) and labels [n] in 0..3: the quadrant
    that is brighter (+1 on average, with a random half of its pixels +2)."""
    rng = _rng(seed, 29)
    y = rng.permutation(np.arange(n) % 4).astype(np.int64)
    x = rng.standard_normal((n, channels, image_size, image_size)).astype(np.float32)
    half = image_size // 2
    lit = (rng.random((n, 1, half, half)) < 0.5).astype(np.float32) * 2.0
    for i in range(n):
        top, left = (y[i] // 2) * half, (y[i] % 2) * half
        x[i, :, top: top + half, left: left + half] += lit[i]
    return x, y


def _split(arrays: tuple[np.ndarray, ...], n_train: int, info: dict) -> Datasets:
    ts = tuple(torch.from_numpy(a) for a in arrays)
    return Datasets(train=tuple(t[:n_train] for t in ts), test=tuple(t[n_train:] for t in ts), info=info)


def _data_fn(task: str) -> Callable[[SizeSpec, int], Datasets]:
    def make_data(spec: SizeSpec, data_seed: int) -> Datasets:
        d, n = spec.data, spec.n_train + spec.n_test
        if task == "sequence_classification":
            k = d.get("n_classes", 4)
            arrays = make_sequences(n, seed=data_seed, seq_len=d.get("seq_len", 16), vocab=d.get("vocab", 64),
                                    n_classes=k)
            info = {"source": "synthetic token streams with one planted marker (lab.workloads.hf)",
                    "n_classes": k, "chance_accuracy": 1.0 / k, "padding": "right, attention_mask 0"}
        elif task == "causal_lm":
            arrays = make_bigram_streams(n, seed=data_seed, seq_len=d.get("seq_len", 16), vocab=d.get("vocab", 64))
            info = {"source": "synthetic streams following a planted bigram permutation (lab.workloads.hf)",
                    "chance_accuracy": 1.0 / d.get("vocab", 64), "padding": "right, attention_mask 0, target -100"}
        else:
            arrays = make_images(n, seed=data_seed, image_size=d.get("image_size", 16),
                                 channels=d.get("channels", 3))
            info = {"source": "synthetic noise images, class = the brighter quadrant (lab.workloads.hf)",
                    "n_classes": 4, "chance_accuracy": 0.25}
        return _split(arrays, spec.n_train, info)
    return make_data


# ------------------------------------------------------------------------------------- loss, metric


def token_loss(outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every position whose target is not ``IGNORE`` (fp32 logits), for any rank."""
    return F.cross_entropy(outputs.float().reshape(-1, outputs.shape[-1]), target.reshape(-1), ignore_index=IGNORE)


def token_metrics(outputs: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Top-1 ``accuracy`` over the positions whose target is not ``IGNORE``, and the loss."""
    logits = outputs.detach().float()
    keep = target != IGNORE
    hits = (logits.argmax(dim=-1) == target) & keep
    return {"accuracy": float(hits.sum()) / max(1, int(keep.sum())), "loss": float(token_loss(logits, target))}


# ----------------------------------------------------------------------------------------- workload

#: Tiny sizes a 2-core CPU trains in seconds (the gallery tests use ``tiny``).
DEFAULT_SIZES = {
    "tiny": SizeSpec(n_train=512, n_test=256, batch_size=32, epochs=2, lr=2e-3),
    "small": SizeSpec(n_train=4_096, n_test=1_024, batch_size=64, epochs=3, lr=1e-3),
    "full": SizeSpec(n_train=65_536, n_test=8_192, batch_size=128, epochs=3, lr=5e-4),
}


def _model_fn(model_factory: Callable[..., nn.Module], task: str) -> Callable[[SizeSpec], nn.Module]:
    takes_args = bool(inspect.signature(model_factory).parameters)

    def make_model(spec: SizeSpec) -> nn.Module:
        model = model_factory(**spec.model) if takes_args else model_factory()
        return HFAdapter(model, task)
    return make_model


def workload(model_factory: Callable[..., nn.Module], task: str = "sequence_classification", *,
             name: str = "hf_model", description: str | None = None,
             sizes: dict[str, SizeSpec] | SizeSpec | None = None,
             data: Callable[[SizeSpec, int], Datasets] | None = None, chance: float | None = None,
             **fields: Any) -> Workload:
    """A lab workload around the HF model ``model_factory()`` (or ``model_factory(**spec.model)`` when it
    takes arguments), wrapped in :class:`HFAdapter` for ``task``, on the task's synthetic data unless ``data``
    (``fn(spec, data_seed) -> Datasets`` whose inputs are the task's tensors) is given."""
    if task not in TASKS:
        raise ValueError(f"task={task!r} is invalid: allowed: {', '.join(TASKS)}")
    lm = task == "causal_lm"
    if chance is None and data is None:
        chance = None if lm else 0.25
    return Workload(name=name, description=description or f"Hugging Face model ({task}) on synthetic data",
                    sizes=sizes or DEFAULT_SIZES, make_data=data or _data_fn(task),
                    make_model=_model_fn(model_factory, task),
                    loss=token_loss, evaluate=token_metrics, metric_name="accuracy", chance=chance,
                    **fields)


# ------------------------------------------------------------------------------------------ gallery
# Each factory imports transformers when it runs (a spec load), never at ``import lab``. Tiny: hidden 32-64,
# 2 layers, 4 heads; the vocabulary and lengths match the synthetic data's defaults (64 tokens, 16 positions).

_NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=16, num_labels=4, **_NO_DROPOUT))


def _bert_dropout() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(  # HF's default dropout 0.1 on hidden states and attention
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=16, num_labels=4))


def _distilbert() -> nn.Module:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    return DistilBertForSequenceClassification(DistilBertConfig(
        vocab_size=64, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=16, num_labels=4,
        dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0))


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=64, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1,
                                      eos_token_id=1))


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, num_labels=4, **_NO_DROPOUT))


def _resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
        num_labels=4, downsample_in_first_stage=False))


#: ViT from random init needs ~100 steps on the quadrant images (2 epochs of ``tiny`` leave it near chance).
VIT_SIZES = {**DEFAULT_SIZES, "tiny": SizeSpec(n_train=512, n_test=256, batch_size=32, epochs=6, lr=2e-3)}


def BERT() -> Workload:  # noqa: N802 - a spec NAME, like the constants the other workloads export
    """``BertForSequenceClassification`` (2 layers, hidden 64, 4 heads) on padded marker streams."""
    return workload(_bert, "sequence_classification", name="hf_bert",
                    description="HF BertForSequenceClassification (2 layers, d 64, 4 heads) on padded marker streams")


def BERT_DROPOUT() -> Workload:  # noqa: N802
    """:func:`BERT` with HF's default dropout (0.1): the arm a compile ablation needs seeds for, since Inductor
    draws its own dropout masks (compiled and eager training differ from step 0 by their RNG stream alone)."""
    return workload(_bert_dropout, "sequence_classification", name="hf_bert_dropout",
                    description="HF BertForSequenceClassification with dropout 0.1 (2 layers, d 64, 4 heads)")


def DISTILBERT() -> Workload:  # noqa: N802
    """``DistilBertForSequenceClassification`` (2 layers, dim 64, 4 heads) on padded marker streams."""
    return workload(_distilbert, "sequence_classification", name="hf_distilbert",
                    description="HF DistilBertForSequenceClassification (2 layers, d 64, 4 heads) on marker streams")


def GPT2() -> Workload:  # noqa: N802
    """``GPT2LMHeadModel`` (2 layers, d 64, HF ``Conv1D`` layers, tied ``lm_head``) on bigram streams."""
    return workload(_gpt2, "causal_lm", name="hf_gpt2", chance=1.0 / 64,
                    description="HF GPT2LMHeadModel (2 layers, d 64, Conv1D layers) on planted bigram streams")


def VIT() -> Workload:  # noqa: N802
    """``ViTForImageClassification`` (16 px, patch 4, 2 layers, d 64) on bright-quadrant images."""
    return workload(_vit, "image_classification", name="hf_vit", sizes=VIT_SIZES,
                    description="HF ViTForImageClassification (16 px, patch 4, 2 layers, d 64) on quadrant images")


def RESNET() -> Workload:  # noqa: N802
    """``ResNetForImageClassification`` (basic blocks, widths 16 / 32) on bright-quadrant images."""
    return workload(_resnet, "image_classification", name="hf_resnet",
                    description="HF ResNetForImageClassification (basic blocks 16/32) on quadrant images")


def GALLERY() -> list[Workload]:  # noqa: N802
    """The ecosystem gallery: every model above (``--workload lab.workloads.hf:GALLERY`` loads them all)."""
    return [BERT(), DISTILBERT(), GPT2(), VIT(), RESNET()]
