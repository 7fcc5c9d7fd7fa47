"""A gallery of user models built from standard blocks, registered through the public door
(``register_workload``) exactly as a user would: each one exercises building blocks the built-in workloads
do not (LayerNorm, GELU, ``nn.TransformerEncoder`` / ``nn.MultiheadAttention``, depthwise convolutions, a
squeeze-excitation gate, ``nn.GRU``, weight tying and a module applied twice).

- ``gallery_mlp``: a LayerNorm + GELU MLP on scikit-learn's breast-cancer table (569 rows, 30 features).
- ``gallery_transformer``: a 2-layer ``nn.TransformerEncoder`` (batch_first, d_model 32, 4 heads) token
  classifier: which of 4 class tokens is planted most often in a 16-token sequence.
- ``gallery_dscnn``: a depthwise-separable CNN with a squeeze-excitation gate on sklearn's 8x8 digits.
- ``gallery_gru``: an ``nn.GRU`` sequence classifier: which of 3 channels accumulates the largest sum.
- ``gallery_tied``: a bag-of-tokens model whose output head is tied to its embedding table and whose
  residual block is one module applied twice: predict the most frequent token.

Every ``tiny`` run takes well under 2 s on a 2-core CPU. Used by ``tests/e2e/test_gallery.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from lab.workloads import Datasets, SizeSpec, Workload, register_workload


def accuracy(out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    return {"accuracy": (out.argmax(1) == y).float().mean().item()}


def _split(x: torch.Tensor, y: torch.Tensor, spec: SizeSpec, seed: int, info: dict) -> Datasets:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(y), generator=g)
    tr, te = idx[:spec.n_train], idx[spec.n_train:spec.n_train + spec.n_test]
    return Datasets(train=(x[tr], y[tr]), test=(x[te], y[te]), info=info)


def _sizes(spec: SizeSpec) -> dict[str, SizeSpec]:
    return {"tiny": spec, "small": spec, "full": spec}


# ------------------------------------------------------------------------------------------------ MLP

def _cancer_data(spec: SizeSpec, seed: int) -> Datasets:
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    return _split(x, torch.tensor(y), spec, seed, {"source": "sklearn load_breast_cancer"})


def _mlp(spec: SizeSpec) -> nn.Module:
    h = spec.model.get("hidden", 64)
    return nn.Sequential(nn.Linear(30, h), nn.LayerNorm(h), nn.GELU(), nn.Linear(h, h // 2), nn.GELU(),
                         nn.Linear(h // 2, 2))


# ---------------------------------------------------------------------------------------- Transformer

VOCAB, SEQ, N_CLASS_TOKENS = 12, 16, 4


def _planted_tokens(n: int, vocab: int, seq: int, n_classes: int, plant: int, g: torch.Generator
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of filler tokens (ids >= n_classes, or any id when n_classes == vocab) with class token
    ``y`` planted ``plant`` times and each other class token at most twice: the label is the mode."""
    y = torch.randint(0, n_classes, (n,), generator=g)
    low = n_classes if n_classes < vocab else 0
    x = torch.randint(low, vocab, (n, seq), generator=g)
    for _ in range(2):  # distractors: a random other class token, at a random position
        pos = torch.randint(0, seq, (n,), generator=g)
        other = (y + torch.randint(1, n_classes, (n,), generator=g)) % n_classes
        x[torch.arange(n), pos] = other
    order = torch.rand(n, seq, generator=g).argsort(1)[:, :plant]
    x.scatter_(1, order, y[:, None].expand(-1, plant))
    return x, y


def planted_token_data(spec: SizeSpec, seed: int, *, seed_base: int, vocab: int, seq: int, n_classes: int,
                       plant: int) -> Datasets:
    """A split of :func:`_planted_tokens` drawn from seed ``seed_base + seed``: the token data of this gallery and
    of the model sets built on it (``pasted_models``, ``zoo_models``), each with its own seed base and sizes."""
    g = torch.Generator().manual_seed(seed_base + seed)
    x, y = _planted_tokens(spec.n_train + spec.n_test, vocab, seq, n_classes, plant, g)
    return _split(x, y, spec, seed, {"source": "planted-mode tokens", "vocab": vocab, "seq": seq})


def right_padded(d: Datasets, *, shift: int, pad: int, most: int) -> Datasets:
    """``d`` with every id shifted by ``shift`` (past the padding id ``pad``) and the last ``i % (most + 1)``
    positions of row ``i`` set to ``pad``: padded rows, for models that build a padding mask in ``forward``."""

    def padded(x: torch.Tensor) -> torch.Tensor:
        x = x + shift
        n_pad = torch.arange(len(x)) % (most + 1)
        x[torch.arange(x.shape[1])[None, :] >= x.shape[1] - n_pad[:, None]] = pad
        return x
    return Datasets(train=(padded(d.train[0]), d.train[1]), test=(padded(d.test[0]), d.test[1]), info=d.info)


def _token_data(spec: SizeSpec, seed: int) -> Datasets:
    return planted_token_data(spec, seed, seed_base=1000, vocab=VOCAB, seq=SEQ, n_classes=N_CLASS_TOKENS, plant=5)


class TokenTransformer(nn.Module):
    """Embedding + learned positions -> 2-layer ``nn.TransformerEncoder`` -> mean pool -> linear head."""

    def __init__(self, d_model: int = 32, heads: int = 4, layers: int = 2, ff: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Parameter(torch.randn(1, SEQ, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=ff, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, N_CLASS_TOKENS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens) + self.pos[:, :tokens.shape[1]])
        return self.head(h.mean(1))


# --------------------------------------------------------------------------------- depthwise CNN + SE

def _digits_data(spec: SizeSpec, seed: int) -> Datasets:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    return _split(x, torch.tensor(y), spec, seed, {"source": "sklearn load_digits (8x8)"})


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(channels, channels // reduction)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(channels // reduction, channels)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.gate(self.fc2(self.act(self.fc1(torch.flatten(self.pool(x), 1)))))
        return x * s[:, :, None, None]


class DepthwiseSeparableSE(nn.Module):
    def __init__(self, width: int = 24) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.depthwise = nn.Sequential(nn.Conv2d(width, width, 3, padding=1, groups=width, bias=False),
                                       nn.BatchNorm2d(width), nn.ReLU())
        self.pointwise = nn.Sequential(nn.Conv2d(width, 2 * width, 1, bias=False), nn.BatchNorm2d(2 * width),
                                       nn.ReLU())
        self.se = SqueezeExcite(2 * width)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.se(self.pointwise(self.depthwise(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


# ------------------------------------------------------------------------------------------------ GRU

def _gru_data(spec: SizeSpec, seed: int) -> Datasets:
    g = torch.Generator().manual_seed(2000 + seed)
    n = spec.n_train + spec.n_test
    x = torch.randn(n, 12, 6, generator=g)
    y = x[:, :, :3].sum(1).argmax(1)
    return _split(x, y, spec, seed, {"source": "argmax of 3 channels' running sums"})


class GRUClassifier(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.gru = nn.GRU(6, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


# ---------------------------------------------------------------------------- weight tying + sharing

TIED_VOCAB, TIED_SEQ = 16, 10


def _tied_data(spec: SizeSpec, seed: int) -> Datasets:
    g = torch.Generator().manual_seed(3000 + seed)
    x, y = _planted_tokens(spec.n_train + spec.n_test, TIED_VOCAB, TIED_SEQ, TIED_VOCAB, 4, g)
    return _split(x, y, spec, seed, {"source": "most frequent of 16 tokens"})


class TiedBagModel(nn.Module):
    """Mean of token embeddings -> the same residual block twice -> LayerNorm -> logits through the
    embedding table itself (``head.weight is embed.weight``)."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(TIED_VOCAB, d)
        self.block = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, TIED_VOCAB, bias=False)
        self.head.weight = self.embed.weight  # weight tying

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).mean(1)
        h = h + self.block(h)
        h = h + self.block(h)  # one module, applied twice
        return self.head(self.norm(h))


# ------------------------------------------------------------------------------------------ registry

def _workload(name: str, description: str, spec: SizeSpec, make_data, make_model) -> Workload:
    return Workload(name=name, description=description, sizes=_sizes(spec), make_data=make_data,
                    make_model=make_model, loss=nn.functional.cross_entropy, evaluate=accuracy,
                    metric_name="accuracy")


GALLERY: dict[str, Workload] = {w.name: w for w in (
    _workload("gallery_mlp", "LayerNorm + GELU MLP on breast cancer",
              SizeSpec(n_train=400, n_test=169, batch_size=32, epochs=3, lr=3e-3), _cancer_data, _mlp),
    _workload("gallery_transformer", "2-layer nn.TransformerEncoder token classifier",
              SizeSpec(n_train=1024, n_test=256, batch_size=64, epochs=3, lr=3e-3), _token_data,
              lambda spec: TokenTransformer()),
    _workload("gallery_dscnn", "depthwise-separable CNN + squeeze-excitation on 8x8 digits",
              SizeSpec(n_train=1200, n_test=400, batch_size=32, epochs=4, lr=1e-2), _digits_data,
              lambda spec: DepthwiseSeparableSE()),
    _workload("gallery_gru", "nn.GRU sequence classifier",
              SizeSpec(n_train=1024, n_test=256, batch_size=64, epochs=3, lr=1e-2), _gru_data,
              lambda spec: GRUClassifier()),
    _workload("gallery_tied", "tied embedding/head + a module applied twice",
              SizeSpec(n_train=1024, n_test=256, batch_size=64, epochs=3, lr=1e-2), _tied_data,
              lambda spec: TiedBagModel()),
)}


def register_gallery() -> dict[str, Workload]:
    """Register (or re-register) every gallery workload; returns them by name."""
    for wl in GALLERY.values():
        register_workload(wl, overwrite=True)
    return GALLERY
