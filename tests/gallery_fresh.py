"""Models as people paste them, a second time: the ``fresh`` held-out set of ``benchmarks/doctor.py`` (issue 45).

Why another set: the ``pasted`` set (``tests/gallery_pasted.py``) was scored before and after the risk-aware
prescription and the small-attention compile rule, and whoever tunes the next rule has read its misses, so it
stops being held out. These models were written *after* those rules and *before* any further rule change;
nothing in ``lab.doctor`` may be fitted on them, and every rule change from here on is scored on them before
and after. Each follows a pattern found in tutorials and public repositories, with the few-line wrapper a user
writes around it, and none repeats a model of ``tests/gallery.py``, ``gallery_unseen.py``, ``gallery_pasted.py``
or ``zoo_models.py``:

- ``fresh_charrnn``: the char-RNN name classifier of PyTorch's tutorial, as a 2-layer bidirectional ``nn.GRU``:
  sequence-first, ``init_hidden`` reads ``next(self.parameters())``, dropout, ``log_softmax`` + ``nll_loss``.
- ``fresh_kws``: a keyword-spotting net on raw audio: frames cut in ``forward`` (``unfold``), a window and a
  DFT basis registered as buffers (the basis as a transposed view), log power, ``Conv1d`` + ``BatchNorm1d`` +
  dropout, ``log_softmax`` output.
- ``fresh_resnet``: the CIFAR ``BasicBlock`` ResNet of the popular pytorch-cifar repositories, narrowed: residual
  adds, 1x1 projection shortcuts, ``ReLU(inplace=True)``, ``Dropout2d`` in the blocks and dropout before the head.
- ``fresh_txcls``: an ``nn.TransformerEncoder`` classifier, ``batch_first=True``, whose padding mask, position
  ids and lengths are integer / bool tensors made from the input ids in ``forward`` (the encoder's nested-tensor
  fast path on in eval), masked mean pooling.
- ``fresh_tabular``: a tabular MLP with a hand-written ``LayerNorm`` module, dropout everywhere, a data-dependent
  ``if torch.isnan(x).any()`` branch and ``log_softmax`` + ``nll_loss``.
- ``fresh_twotower``: a two-tower recommender: a user tower over an ``nn.EmbeddingBag`` of the history (its table
  tied to the item tower's embedding), every item scored by a dot product, a ``(scores, user_vec)`` tuple out.
- ``fresh_vit``: a timm-style ViT: ``Conv2d`` patch embedding, a class token, one fused ``qkv`` Linear reshaped
  and ``unbind`` into heads, hand-written attention with dropout, stochastic depth (``DropPath``), and a
  data-dependent ``if x.max() > 1: x = x / 255`` on its raw 0-255 pixels.

Each ``tiny`` step takes roughly 5-60 ms on one CPU thread (measurable by the doctor); data are generated from a
seed, never downloaded, and each task's loss falls within a few dozen steps. ``tests/e2e/test_heldout_sets.py``
checks each builds and trains through the lab.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from gallery import _planted_tokens, _sizes, _split, _workload, accuracy
from torch import nn

from lab.workloads import Datasets, SizeSpec, Workload, register_workload

# ------------------------------------------------------------------- char-RNN name classifier (GRU)

N_CHARS, NAME_LEN, N_ORIGINS = 28, 16, 4  # ids 0-1 unused ("<pad>", "<unk>"), letters 2..27
#: each origin's names end with letters drawn from its own five (a suffix like "-ski", "-ez", "-ov", "-son")
_SUFFIX_LETTERS = torch.arange(2, 2 + 5 * N_ORIGINS).view(N_ORIGINS, 5)


def _names_data(spec: SizeSpec, seed: int) -> Datasets:
    """Random letters with a class-specific 3-letter suffix (one letter of it replaced by noise at random)."""
    g = torch.Generator().manual_seed(9000 + seed)
    n = spec.n_train + spec.n_test
    y = torch.randint(0, N_ORIGINS, (n,), generator=g)
    x = torch.randint(2, N_CHARS, (n, NAME_LEN), generator=g)
    suffix = _SUFFIX_LETTERS[y][torch.arange(n)[:, None], torch.randint(0, 5, (n, 3), generator=g)]
    x[:, -3:] = suffix
    noisy = torch.randint(0, 3, (n,), generator=g)
    x[torch.arange(n), NAME_LEN - 3 + noisy] = torch.randint(2, N_CHARS, (n,), generator=g)
    return _split(x, y, spec, seed, {"source": "random names, origin told by a 3-letter suffix", "vocab": N_CHARS})


class CharRNN(nn.Module):
    """The tutorial's ``RNN`` grown up: embedding -> bidirectional GRU (seq-first) -> log-probabilities."""

    def __init__(self, n_chars: int = N_CHARS, emb: int = 32, hidden: int = 64, layers: int = 2,
                 n_classes: int = N_ORIGINS, dropout: float = 0.2) -> None:
        super().__init__()
        self.hidden_size, self.num_layers = hidden, layers
        self.embedding = nn.Embedding(n_chars, emb)
        self.gru = nn.GRU(emb, hidden, layers, dropout=dropout, bidirectional=True)
        self.dropout = nn.Dropout(dropout)
        self.h2o = nn.Linear(2 * hidden, n_classes)
        self.softmax = nn.LogSoftmax(dim=1)

    def init_hidden(self, batch_size: int) -> torch.Tensor:
        weight = next(self.parameters())
        return weight.new_zeros(2 * self.num_layers, batch_size, self.hidden_size)

    def forward(self, line_tensor: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        output, hidden = self.gru(self.dropout(self.embedding(line_tensor)), hidden)
        return self.softmax(self.h2o(self.dropout(output[-1]))), hidden


class NameClassifier(nn.Module):
    """The user's wrapper: batch-first ids in (the lab's loader), the tutorial's seq-first call inside."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = CharRNN()

    def forward(self, names: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(names.t(), self.rnn.init_hidden(names.shape[0]))
        return out


# ------------------------------------------------------------------------ keyword spotting on raw audio

CLIP, WIN, HOP, N_BINS, N_WORDS = 2048, 128, 64, 32, 5


def _keywords_data(spec: SizeSpec, seed: int) -> Datasets:
    """Five synthetic "keywords" (a rising chirp, a falling one, two steady tones, a two-tone), at a random
    offset inside a noisy clip."""
    g = torch.Generator().manual_seed(9100 + seed)
    n = spec.n_train + spec.n_test
    y = torch.randint(0, N_WORDS, (n,), generator=g)
    t = torch.arange(CLIP // 2, dtype=torch.float32) / CLIP  # the word lasts half the clip
    f0 = torch.tensor([20.0, 180.0, 40.0, 140.0, 60.0])[y][:, None] * (1 + 0.1 * torch.rand(n, 1, generator=g))
    slope = torch.tensor([320.0, -320.0, 0.0, 0.0, 0.0])[y][:, None]
    phase = 2 * math.pi * (f0 * t + slope * t * t)
    word = torch.sin(phase) + (y == 4).float()[:, None] * torch.sin(3.1 * phase)
    word = word * torch.hann_window(CLIP // 2, periodic=False)
    x = 0.7 * torch.randn(n, CLIP, generator=g)
    start = torch.randint(0, CLIP // 2, (n,), generator=g)
    idx = start[:, None] + torch.arange(CLIP // 2)
    x.scatter_add_(1, idx, word)
    return _split(x, y, spec, seed, {"source": "5 synthetic chirp / tone keywords in noise", "clip": CLIP})


class KeywordSpotter(nn.Module):
    """Raw clip -> frames (``unfold``) x Hann window -> power on a DFT basis (a buffer kept as ``basis.t()``,
    a transposed view) -> log -> three ``Conv1d`` / ``BatchNorm1d`` / ReLU / max-pool blocks with dropout ->
    global average -> ``log_softmax``."""

    def __init__(self, width: int = 64, dropout: float = 0.1) -> None:
        super().__init__()
        k = torch.arange(N_BINS, dtype=torch.float32)[:, None]
        m = torch.arange(WIN, dtype=torch.float32)[None]
        basis = torch.cat([torch.cos(2 * math.pi * (k + 1) * m / WIN), torch.sin(2 * math.pi * (k + 1) * m / WIN)])
        self.register_buffer("window", torch.hann_window(WIN))
        self.register_buffer("basis", basis.t())  # (WIN, 2 * N_BINS), not contiguous
        layers: list[nn.Module] = []
        c_in = N_BINS
        for c_out in (width, width, 2 * width):
            layers += [nn.Conv1d(c_in, c_out, 3, padding=1), nn.BatchNorm1d(c_out), nn.ReLU(), nn.MaxPool1d(2),
                       nn.Dropout(dropout)]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, N_WORDS)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        frames = wav.unfold(-1, WIN, HOP) * self.window  # (B, frames, WIN)
        spec = frames @ self.basis
        power = spec[..., :N_BINS] ** 2 + spec[..., N_BINS:] ** 2
        x = torch.log(power + 1e-6).transpose(1, 2)  # (B, bins, frames)
        x = self.features(x)
        return F.log_softmax(self.fc(x.mean(-1)), dim=-1)


# ------------------------------------------------------------------------------ CIFAR-style ResNet

IMG, N_SHAPES = 16, 4


def _bars_data(spec: SizeSpec, seed: int) -> Datasets:
    """16 x 16 RGB images of a bar (horizontal, vertical, diagonal, anti-diagonal) in a random colour and place,
    on noise, normalised as ``transforms.Normalize`` would."""
    g = torch.Generator().manual_seed(9200 + seed)
    n = spec.n_train + spec.n_test
    y = torch.randint(0, N_SHAPES, (n,), generator=g)
    r = torch.arange(IMG)
    shift = torch.randint(-4, 5, (n, 1, 1), generator=g)
    rows, cols = r[None, :, None], r[None, None, :]
    masks = torch.stack(torch.broadcast_tensors((rows - IMG // 2 - shift).abs() <= 1,
                                                (cols - IMG // 2 - shift).abs() <= 1, (rows - cols - shift).abs() <= 1,
                                                (rows + cols - IMG + 1 - shift).abs() <= 1), 1)
    mask = masks[torch.arange(n), y].float()  # (n, IMG, IMG)
    colour = 0.5 + 0.5 * torch.rand(n, 3, 1, 1, generator=g)
    x = 0.6 * torch.rand(n, 3, IMG, IMG, generator=g) + colour * mask[:, None]
    x = (x - 0.45) / 0.3
    return _split(x, y, spec, seed, {"source": "coloured bars in 4 orientations on noise"})


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1, drop: float = 0.1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.drop = nn.Dropout2d(drop)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, self.expansion * planes, kernel_size=1, stride=stride,
                                                    bias=False), nn.BatchNorm2d(self.expansion * planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(self.drop(out)))
        out += self.shortcut(x)
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, num_blocks: tuple[int, ...] = (1, 1, 1), width: int = 16, num_classes: int = N_SHAPES
                 ) -> None:
        super().__init__()
        self.in_planes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = self._make_layer(width, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(2 * width, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(4 * width, num_blocks[2], stride=2)
        self.dropout = nn.Dropout(0.3)
        self.linear = nn.Linear(4 * width * BasicBlock.expansion, num_classes)

    def _make_layer(self, planes: int, num_blocks: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(BasicBlock(self.in_planes, planes, s))
            self.in_planes = planes * BasicBlock.expansion
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).view(out.size(0), -1)
        return self.linear(self.dropout(out))


# -------------------------------------------------- TransformerEncoder classifier, padding mask made in forward

TX_VOCAB, TX_LEN, TX_CLASSES, TX_PAD = 40, 32, 6, 0


def _padded_tokens(spec: SizeSpec, seed: int) -> Datasets:
    """Which of 6 class tokens is planted most often, ids shifted past ``TX_PAD``, right-padded to a random
    length (at least half the sequence)."""
    g = torch.Generator().manual_seed(9300 + seed)
    n = spec.n_train + spec.n_test
    x, y = _planted_tokens(n, TX_VOCAB - 1, TX_LEN // 2, TX_CLASSES, 4, g)
    tail = torch.randint(TX_CLASSES, TX_VOCAB - 1, (n, TX_LEN // 2), generator=g)
    x = torch.cat([x, tail], 1) + 1
    keep = torch.randint(TX_LEN // 2, TX_LEN + 1, (n, 1), generator=g)
    x = torch.where(torch.arange(TX_LEN) < keep, x, torch.full_like(x, TX_PAD))
    return _split(x, y, spec, seed, {"source": "most frequent of 6 class tokens, right-padded", "vocab": TX_VOCAB})


class TransformerClassifier(nn.Module):
    """Token + learned position embeddings -> ``nn.TransformerEncoder`` (``batch_first``, key padding mask from
    the ids) -> mean over the real tokens -> head."""

    def __init__(self, d_model: int = 64, nhead: int = 4, num_layers: int = 2, dim_ff: int = 128,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(TX_VOCAB, d_model, padding_idx=TX_PAD)
        self.pos_emb = nn.Embedding(TX_LEN, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=dim_ff, dropout=dropout,
                                           activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers)
        self.norm = nn.LayerNorm(d_model)
        self.classifier = nn.Linear(d_model, TX_CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        b, t = input_ids.shape
        positions = torch.arange(t, device=input_ids.device).unsqueeze(0).expand(b, t)
        padding_mask = input_ids == TX_PAD
        x = self.tok_emb(input_ids) + self.pos_emb(positions)
        x = self.encoder(x, src_key_padding_mask=padding_mask)
        keep = (~padding_mask).unsqueeze(-1).type_as(x)
        lengths = keep.sum(1).clamp(min=1)
        return self.classifier(self.norm((x * keep).sum(1) / lengths))


# ------------------------------------------------------------------- tabular MLP, hand-written LayerNorm

TAB_FEATURES, TAB_CLASSES = 40, 6


def _teacher_data(spec: SizeSpec, seed: int) -> Datasets:
    """Features from a seed, the label the argmax of a fixed random two-layer teacher plus noise."""
    g = torch.Generator().manual_seed(9400 + seed)
    n = spec.n_train + spec.n_test
    x = torch.randn(n, TAB_FEATURES, generator=g)
    w1 = torch.randn(TAB_FEATURES, 32, generator=g) / math.sqrt(TAB_FEATURES)
    w2 = torch.randn(32, TAB_CLASSES, generator=g)
    y = (torch.tanh(x @ w1) @ w2 + 0.3 * torch.randn(n, TAB_CLASSES, generator=g)).argmax(1)
    return _split(x, y, spec, seed, {"source": "a random two-layer teacher over 40 features (6 classes)"})


class LayerNorm(nn.Module):
    """"Construct a layernorm module" as the annotated-transformer writes it: mean and std by hand."""

    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class TabularNet(nn.Module):
    def __init__(self, n_features: int = TAB_FEATURES, hidden: int = 384, n_layers: int = 3,
                 n_classes: int = TAB_CLASSES, dropout: float = 0.2) -> None:
        super().__init__()
        self.input_norm = LayerNorm(n_features)
        blocks: list[nn.Module] = []
        d = n_features
        for _ in range(n_layers):
            blocks += [nn.Linear(d, hidden), LayerNorm(hidden), nn.ReLU(), nn.Dropout(dropout)]
            d = hidden
        self.body = nn.Sequential(*blocks)
        self.out = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.isnan(x).any():  # missing values in a real table: a data-dependent branch
            x = torch.nan_to_num(x)
        return F.log_softmax(self.out(self.body(self.input_norm(x))), dim=1)


# ------------------------------------------------------------------ two-tower recommender (EmbeddingBag, tied)

N_USERS, N_ITEMS, HISTORY = 200, 1000, 24


def _histories_data(spec: SizeSpec, seed: int) -> Datasets:
    """A user id and a history of item ids (0 pads its tail); the next item is the one the history repeats."""
    g = torch.Generator().manual_seed(9500 + seed)
    n = spec.n_train + spec.n_test
    hist, y = _planted_tokens(n, N_ITEMS - 1, HISTORY, N_ITEMS - 1, 4, g)
    hist, y = hist + 1, y + 1
    keep = torch.randint(HISTORY * 2 // 3, HISTORY + 1, (n, 1), generator=g)
    hist = torch.where(torch.arange(HISTORY) < keep, hist, torch.zeros_like(hist))
    user = torch.randint(0, N_USERS, (n, 1), generator=g)
    return _split(torch.cat([user, hist], 1), y, spec, seed, {"source": "user + item history, next = the repeated "
                                                                        "item", "items": N_ITEMS})


class TwoTower(nn.Module):
    """User tower (user embedding + mean ``EmbeddingBag`` of the history, tied to the item table) and item tower
    (the item table through an MLP); every item scored by a dot product."""

    def __init__(self, d: int = 64, hidden: int = 512) -> None:
        super().__init__()
        self.user_emb = nn.Embedding(N_USERS, d)
        self.item_emb = nn.Embedding(N_ITEMS, d, padding_idx=0)
        self.history = nn.EmbeddingBag(N_ITEMS, d, mode="mean", padding_idx=0)
        self.history.weight = self.item_emb.weight  # one item table for both towers
        self.user_mlp = nn.Sequential(nn.Linear(2 * d, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, d))
        self.item_mlp = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, d))

    def forward(self, user_ids: torch.Tensor, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = self.user_mlp(torch.cat([self.user_emb(user_ids), self.history(history)], -1))
        items = self.item_emb.weight + self.item_mlp(self.item_emb.weight)
        return u @ items.t(), u


class NextItem(nn.Module):
    """The user's wrapper: one id tensor in (user, then history), the scores out."""

    def __init__(self) -> None:
        super().__init__()
        self.model = TwoTower()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores, _ = self.model(x[:, 0], x[:, 1:])
        return scores


# ------------------------------------------------------------------------------------ timm-style ViT

VIT_IMG, PATCH, N_COLOURS = 16, 4, 4


def _colour_data(spec: SizeSpec, seed: int) -> Datasets:
    """Raw 0-255 RGB images of noise with one 5 x 5 square at a random place; the label is its colour (red,
    green, blue or yellow)."""
    g = torch.Generator().manual_seed(9600 + seed)
    n = spec.n_train + spec.n_test
    y = torch.randint(0, N_COLOURS, (n,), generator=g)
    top = torch.randint(0, VIT_IMG - 4, (n,), generator=g)
    left = torch.randint(0, VIT_IMG - 4, (n,), generator=g)
    r = torch.arange(VIT_IMG)
    inside = ((r[None, :, None] >= top[:, None, None]) & (r[None, :, None] < top[:, None, None] + 5)
              & (r[None, None, :] >= left[:, None, None]) & (r[None, None, :] < left[:, None, None] + 5))
    rgb = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]])[y][:, :, None, None]
    x = 120 * torch.rand(n, 3, VIT_IMG, VIT_IMG, generator=g) + 135 * rgb * inside[:, None].float()
    return _split(x.round(), y, spec, seed, {"source": "0-255 noise images, the colour of one square"})


def drop_path(x: torch.Tensor, drop_prob: float = 0.0, training: bool = False) -> torch.Tensor:
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    return x * random_tensor / keep_prob


class DropPath(nn.Module):
    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int = 4, qkv_bias: bool = True, attn_drop: float = 0.1,
                 proj_drop: float = 0.1) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = self.attn_drop(attn.softmax(dim=-1))
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 2.0, drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(int(dim * mlp_ratio), dim), nn.Dropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class VisionTransformer(nn.Module):
    def __init__(self, img_size: int = VIT_IMG, patch_size: int = PATCH, embed_dim: int = 64, depth: int = 4,
                 num_heads: int = 4, num_classes: int = N_COLOURS, drop_path_rate: float = 0.1) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, embed_dim, kernel_size=patch_size, stride=patch_size)
        num_patches = (img_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, embed_dim) * 0.02)
        self.pos_drop = nn.Dropout(0.1)
        dpr = [r.item() for r in torch.linspace(0, drop_path_rate, depth)]  # stochastic depth decay rule
        self.blocks = nn.Sequential(*[ViTBlock(embed_dim, num_heads, drop_path=dpr[i]) for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.max() > 1:  # raw 0-255 pixels: scale them (a data-dependent branch)
            x = x / 255.0
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.blocks(self.pos_drop(x + self.pos_embed))
        return self.head(self.norm(x)[:, 0])


# ------------------------------------------------------------------------------------------ registry

def _nll_workload(name: str, description: str, spec: SizeSpec, make_data, make_model) -> Workload:
    """A model whose output is log-probabilities, trained with ``nll_loss`` as its tutorial does."""
    return Workload(name=name, description=description, sizes=_sizes(spec), make_data=make_data,
                    make_model=make_model, loss=F.nll_loss, evaluate=accuracy, metric_name="accuracy")


FRESH: dict[str, Workload] = {w.name: w for w in (
    _nll_workload("fresh_charrnn", "char-RNN name classifier: bidirectional GRU, seq-first, next(self.parameters()), "
                  "log_softmax + nll_loss", SizeSpec(n_train=1024, n_test=256, batch_size=64, epochs=3, lr=3e-3),
                  _names_data, lambda spec: NameClassifier()),
    _nll_workload("fresh_kws", "keyword spotting on raw audio: unfold frames, transposed-view DFT buffer, Conv1d + "
                  "BatchNorm, log_softmax", SizeSpec(n_train=1024, n_test=256, batch_size=64, epochs=3, lr=3e-3),
                  _keywords_data, lambda spec: KeywordSpotter()),
    _workload("fresh_resnet", "CIFAR BasicBlock ResNet: residual adds, inplace ReLU, Dropout2d",
              SizeSpec(n_train=1024, n_test=256, batch_size=64, epochs=3, lr=3e-3), _bars_data,
              lambda spec: ResNet()),
    _workload("fresh_txcls", "nn.TransformerEncoder classifier: padding mask and positions made from ids in forward",
              SizeSpec(n_train=1024, n_test=256, batch_size=64, epochs=3, lr=1e-3), _padded_tokens,
              lambda spec: TransformerClassifier()),
    _nll_workload("fresh_tabular", "tabular MLP: hand-written LayerNorm, isnan branch, dropout, log_softmax + "
                  "nll_loss", SizeSpec(n_train=2048, n_test=512, batch_size=128, epochs=3, lr=1e-3),
                  _teacher_data, lambda spec: TabularNet()),
    _workload("fresh_twotower", "two-tower recommender: EmbeddingBag history tied to the item table, tuple out",
              SizeSpec(n_train=2048, n_test=512, batch_size=128, epochs=3, lr=3e-3), _histories_data,
              lambda spec: NextItem()),
    _workload("fresh_vit", "timm-style ViT: fused qkv unbind, DropPath, x.max() > 1 branch on raw pixels",
              SizeSpec(n_train=1024, n_test=256, batch_size=64, epochs=3, lr=1e-3), _colour_data,
              lambda spec: VisionTransformer()),
)}


def register_fresh() -> dict[str, Workload]:
    """Register (or re-register) every fresh-set workload; returns them by name."""
    for wl in FRESH.values():
        register_workload(wl, overwrite=True)
    return FRESH
