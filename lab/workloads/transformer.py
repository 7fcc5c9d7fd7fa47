"""Transformer workload: a Transformer encoder classifies the order of two planted tokens in a token stream.

Why it is here: most users train Transformers, and a crossover map without one would say little about them.
The task is the token counterpart of the ``sequence`` workload: each stream of ``seq_len``
random tokens carries two event tokens (A or B) at random positions t1 < t2 and a distractor token at a
third; the class is the ordered pair (A then B, B then A, A then A, B then B). Classes 0 and 1 hold the
same bag of tokens, so a model that ignores positions tops out at 75 %; chance is 25 %. Generated, so any
size, offline, deterministic. The model is ``nn.TransformerEncoder`` (pre-norm, GELU, 4x feed-forward) with
learned token and position embeddings and a mean-pooled linear head. Notebook: ``notebooks/07_scale.ipynb``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .base import Datasets, SizeSpec, ladder
from .metrics import classifier
from .sequence import CLASS_ORDER

#: Reserved token ids: the two event tokens and the distractor; noise tokens are the rest of the vocabulary.
TOKEN_A, TOKEN_B, TOKEN_DISTRACTOR = 0, 1, 2


def make_token_streams(n: int, *, seed: int, seq_len: int = 32, vocab: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """``n`` token streams ``x`` [n, seq_len] int64 and labels ``y`` [n] int64 (balanced classes)."""
    if seq_len < 3:
        raise ValueError(f"seq_len must be >= 3 (two events and a distractor), got {seq_len}")
    if vocab < 4:
        raise ValueError(f"vocab must be >= 4 (three reserved tokens and noise), got {vocab}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7]))
    y = rng.permutation(np.arange(n) % len(CLASS_ORDER)).astype(np.int64)
    x = rng.integers(3, vocab, size=(n, seq_len), dtype=np.int64)
    steps = np.argsort(rng.random((n, seq_len)), axis=1)[:, :3]
    t1, t2 = np.minimum(steps[:, 0], steps[:, 1]), np.maximum(steps[:, 0], steps[:, 1])
    order = np.asarray(CLASS_ORDER)[y]  # 0 = A, 1 = B, which are token ids 0 and 1
    rows = np.arange(n)
    x[rows, t1] = order[:, 0]
    x[rows, t2] = order[:, 1]
    x[rows, steps[:, 2]] = TOKEN_DISTRACTOR
    return x, y


def _make_data(spec: SizeSpec, data_seed: int) -> Datasets:
    d = spec.data
    x, y = make_token_streams(spec.n_train + spec.n_test, seed=data_seed, seq_len=d.get("seq_len", 32),
                              vocab=d.get("vocab", 64))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    n = spec.n_train
    info = {"source": "synthetic ordered-token streams, lab.workloads.transformer.make_token_streams",
            "n_classes": len(CLASS_ORDER), "chance_accuracy": 1.0 / len(CLASS_ORDER),
            "order_blind_ceiling": 0.75, "shape": list(x.shape[1:])}
    return Datasets(train=(xt[:n], yt[:n]), test=(xt[n:], yt[n:]), info=info)


class TokenClassifier(nn.Module):
    """Token + learned position embeddings, ``nn.TransformerEncoder`` (pre-norm, batch_first, no dropout:
    the runs are short and the timings should not carry dropout's masks), mean pool, linear head.
    ``forward(tokens [B, T] int64) -> logits [B, n_classes]``."""

    def __init__(self, vocab: int = 64, seq_len: int = 32, d_model: int = 64, num_layers: int = 2,
                 heads: int = 4, n_classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens) + self.pos[: tokens.shape[1]])
        return self.head(self.norm(h.mean(dim=1)))


def _make_model(spec: SizeSpec) -> nn.Module:
    m, d = spec.model, spec.data
    return TokenClassifier(vocab=d.get("vocab", 64), seq_len=d.get("seq_len", 32), d_model=m.get("d_model", 64),
                           num_layers=m.get("num_layers", 2), heads=m.get("heads", 4), n_classes=len(CLASS_ORDER))


SIZES = {
    "tiny": SizeSpec(n_train=2_048, n_test=1_024, batch_size=64, epochs=3, lr=3e-3,
                     model={"d_model": 32, "num_layers": 1, "heads": 2}),
    "small": SizeSpec(n_train=32_768, n_test=4_096, batch_size=64, epochs=3, lr=1e-3,
                      model={"d_model": 64, "num_layers": 2, "heads": 4}),
    "full": SizeSpec(n_train=500_000, n_test=50_000, batch_size=256, epochs=5, lr=5e-4,
                     model={"d_model": 256, "num_layers": 6, "heads": 8}),
}

#: Model-size ladder: width, then depth; ~5 k -> ~9.5 M parameters on the same token streams.
SCALES = ladder(xs={"d_model": 16, "num_layers": 1, "heads": 2}, s={"d_model": 64, "num_layers": 2, "heads": 4},
                m={"d_model": 128, "num_layers": 4, "heads": 4}, l={"d_model": 256, "num_layers": 4, "heads": 8},
                xl={"d_model": 512, "num_layers": 3, "heads": 8})

WORKLOAD = classifier(
    name="transformer",
    description="Transformer encoder on 32-token streams whose class is the order of two planted tokens.",
    chance=1.0 / len(CLASS_ORDER),
    sizes=SIZES, make_data=_make_data, make_model=_make_model, scales=SCALES,
    reference={
        "tiny": "accuracy 0.25 -> above chance in ~2 s; for tests",
        "small": "2-layer d=64 encoder on 32k streams (chance 0.25, order-blind ceiling 0.75)",
        "full": "500k streams, 6-layer d=256 encoder; meant for a GPU, not measured on CPU",
    },
)
