"""A zoo of real-world model patterns (issue 45, item 3): one tiny model per pattern that public model code uses
and the built-in workloads never do, each brought to the lab by spec (``tests/zoo_models.py:NAME``) like any
user's file. Beside ``tests/pasted_models.py`` (models copied whole); here each model carries one pattern:

- ``zoo_next_params``: ``forward`` reads ``next(self.parameters())`` for the dtype and device of a tensor it makes.
- ``zoo_view_buffers``: buffers registered as views (a transposed positional table, a slice of a larger one).
- ``zoo_tied``: the output head shares its weight with the input embedding (``head.weight = embed.weight``).
- ``zoo_tuple_out``: nanoGPT's ``forward(idx, targets=None) -> (logits, loss)``, through the lab's adapter
  ``lab.workloads.FirstOutput`` (``zoo_tuple_out_raw``, pasted as is, is refused before the work, naming it).
- ``zoo_seq_first``: an ``nn.LSTM`` without ``batch_first``: the model turns the batch sequence-first inside.
- ``zoo_log_softmax``: ``F.log_softmax`` outputs trained with ``F.nll_loss``.
- ``zoo_int_forward``: integer tensors made in ``forward`` (positions from ``arange``, a padding mask's
  ``cumsum``) feeding an embedding and a mask.
- ``zoo_data_branch``: a branch on a tensor's value (``if h.abs().mean() > 1``): no full graph exists.
- ``zoo_transformer_subclass``: an ``nn.Transformer`` subclass (sequence-first, a float causal mask), as in
  PyTorch's word-language-model example (``pasted_models.TransformerModel``), smaller.
- ``zoo_custom_layernorm``: nanoGPT's hand-written ``LayerNorm`` (own ``weight`` / optional ``bias`` Parameters,
  ``F.layer_norm``) and a hand-written RMSNorm.
- ``zoo_fused_qkv``: nanoGPT's ``GPT`` (one block): its ``CausalSelfAttention`` makes q, k and v with one
  ``c_attn`` Linear, split into heads, ``F.scaled_dot_product_attention``.
- ``zoo_dropout``: dropout after the embedding, inside attention and on every residual branch (p = 0.1).

Data: the gallery's planted-mode tokens (the label is the class token planted most often), 64 training rows,
batch 32, one epoch: two steps. Every ``tiny`` run takes well under a second on a 2-core CPU. Used by
``tests/e2e/test_zoo.py`` and ``tests/zoo_table.py`` (the pattern x technique table).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gallery import accuracy, planted_token_data, right_padded
from gallery_pasted import LayerNorm  # nanoGPT's, as the pasted set writes it
from pasted_models import TransformerModel
from torch import nn

from lab.workloads import Datasets, FirstOutput, SizeSpec, Workload

VOCAB, SEQ, N_CLASSES, D = 12, 8, 4, 16
PAD = 0  # zoo_int_forward pads with 0: the planted ids are shifted by one


def _tokens(spec: SizeSpec, seed: int) -> Datasets:
    return planted_token_data(spec, seed, seed_base=7000, vocab=VOCAB, seq=SEQ, n_classes=N_CLASSES, plant=4)


def _padded(spec: SizeSpec, seed: int) -> Datasets:
    """The tokens shifted past the padding id 0, the last 0-2 positions of each row padded."""
    return right_padded(_tokens(spec, seed), shift=1, pad=PAD, most=2)


class FeedForward(nn.Module):
    def __init__(self, d: int = D, p: float = 0.0) -> None:
        super().__init__()
        self.fc, self.proj, self.drop = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class BagHead(nn.Module):
    """Embedding -> feed-forward block -> mean pool -> head: the body most patterns below change one thing of."""

    def __init__(self, vocab: int = VOCAB) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, D)
        self.block = FeedForward()
        self.head = nn.Linear(D, N_CLASSES)


# ----------------------------------------------------------------------------------------------- the patterns


class NextParams(BagHead):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        weight = next(self.parameters())  # word_language_model's init_hidden: the dtype and device of the model
        bias = weight.new_zeros(tokens.shape[0], 1, D)
        h = self.embed(tokens) + bias
        return self.head((h + self.block(h)).mean(1))


class ViewBuffers(BagHead):
    def __init__(self) -> None:
        super().__init__()
        table = torch.sin(torch.arange(4 * SEQ, dtype=torch.float)[:, None] / (1 + torch.arange(D)[None, :]))
        self.register_buffer("pe", table.unsqueeze(0).transpose(0, 1))  # [4*SEQ, 1, D]: a transposed view
        self.register_buffer("pe_head", table[:SEQ])  # a slice: a view into a larger storage

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pe[:tokens.shape[1], 0][None] + 0.1 * self.pe_head[None]
        return self.head((h + self.block(h)).mean(1))


class Tied(nn.Module):
    """An embedding whose output head is the same matrix (``lm_head.weight = wte.weight``), scores over the
    vocabulary's first ``N_CLASSES`` rows (the class tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.block = FeedForward()
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.block(self.embed(tokens)).mean(1))[:, :N_CLASSES]


class TupleOut(BagHead):
    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple:
        h = self.embed(idx)
        logits = self.head((h + self.block(h)).mean(1))
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss


class SeqFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.rnn = nn.LSTM(D, D)  # sequence-first: [seq, batch, feature]
        self.head = nn.Linear(D, N_CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens.t()))
        return self.head(out.mean(0))


class LogSoftmax(BagHead):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        return F.log_softmax(self.head((h + self.block(h)).mean(1)), dim=-1)


class IntForward(nn.Module):
    """Positions made in ``forward`` (``arange``, then the padding mask's ``cumsum``), a padding mask applied."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB + 1, D, padding_idx=PAD)
        self.pos = nn.Embedding(SEQ + 1, D, padding_idx=PAD)
        self.block = FeedForward()
        self.head = nn.Linear(D, N_CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        keep = tokens.ne(PAD).int()
        positions = torch.cumsum(keep, dim=1) * keep  # 1.. for tokens, 0 (the padding row) for padding
        steps = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        h = self.embed(tokens) + self.pos(positions) + 0.0 * steps.unsqueeze(-1)
        h = h + self.block(h)
        mask = keep.unsqueeze(-1).to(h.dtype)
        return self.head((h * mask).sum(1) / mask.sum(1).clamp(min=1))


class DataBranch(BagHead):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        if h.abs().mean() > 1.0:  # a branch on a value: torch.export and FX symbolic tracing both stop here
            h = h / h.abs().mean()
        return self.head((h + self.block(h)).mean(1))


class TransformerSubclass(TransformerModel):
    """word_language_model's ``TransformerModel`` (an ``nn.Transformer`` subclass), batch-first tokens in, the
    last position's log-probabilities of the class tokens out."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens.t())[-1][:, :N_CLASSES]


class RMSNorm(nn.Module):
    """A hand-written RMSNorm (LLaMA's), in fp32 whatever the input's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class CustomLayerNorm(BagHead):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_f = LayerNorm(D, bias=False), RMSNorm(D)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = h + self.block(self.ln_1(h))
        return self.head(self.ln_f(h).mean(1))


class CausalSelfAttention(nn.Module):
    """nanoGPT's: one Linear makes q, k, v for every head; split, attend causally, project back."""

    def __init__(self, d: int = D, n_head: int = 2, p: float = 0.0) -> None:
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.attn_dropout, self.resid_dropout = nn.Dropout(p), nn.Dropout(p)
        self.n_head, self.n_embd, self.dropout = n_head, d, p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    """nanoGPT's transformer block: pre-norm attention and MLP, each a residual branch."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn, self.mlp = CausalSelfAttention(p=p), FeedForward(p=p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class FusedQKV(nn.Module):
    """nanoGPT's ``GPT`` (its ``transformer`` ModuleDict: ``wte``, ``wpe``, ``drop``, ``h``, ``ln_f``), one block,
    the last position's class scores."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, D), wpe=nn.Embedding(SEQ, D), drop=nn.Dropout(p),
            h=nn.ModuleList([Block(p)]), ln_f=nn.LayerNorm(D)))
        self.head = nn.Linear(D, N_CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = self.transformer
        pos = torch.arange(0, tokens.shape[1], dtype=torch.long, device=tokens.device)
        x = t.drop(t.wte(tokens) + t.wpe(pos))
        for block in t.h:
            x = block(x)
        return self.head(t.ln_f(x)[:, -1])


class Dropout(FusedQKV):
    def __init__(self) -> None:
        super().__init__(p=0.1)


# ------------------------------------------------------------------------------------------------ workloads


def _workload(name: str, description: str, make_model, *, loss=F.cross_entropy, evaluate=accuracy,
              make_data=_tokens, lr: float = 1e-2) -> Workload:
    spec = SizeSpec(n_train=64, n_test=32, batch_size=32, epochs=1, lr=lr)
    return Workload(name=name, description=description, sizes={"tiny": spec, "small": spec, "full": spec},
                    make_data=make_data, make_model=lambda spec: make_model(), loss=loss, evaluate=evaluate,
                    metric_name="accuracy", chance=1 / N_CLASSES)


def NEXT_PARAMS() -> Workload:
    return _workload("zoo_next_params", "forward reads next(self.parameters())", NextParams)


def VIEW_BUFFERS() -> Workload:
    return _workload("zoo_view_buffers", "buffers that are views (transposed, sliced)", ViewBuffers)


def TIED() -> Workload:
    return _workload("zoo_tied", "output head tied to the embedding", Tied)


def TUPLE_OUT() -> Workload:
    """Through the lab's adapter (:class:`lab.workloads.FirstOutput`); ``TUPLE_OUT_RAW`` is refused, naming it."""
    return _workload("zoo_tuple_out", "forward returns (logits, loss), through lab.workloads.FirstOutput",
                     lambda: FirstOutput(TupleOut()))


def TUPLE_OUT_RAW() -> Workload:
    return _workload("zoo_tuple_out_raw", "forward returns (logits, loss), pasted as is", TupleOut,
                     loss=lambda out, y: F.cross_entropy(out[0], y), evaluate=lambda out, y: accuracy(out[0], y))


def SEQ_FIRST() -> Workload:
    return _workload("zoo_seq_first", "sequence-first LSTM", SeqFirst)


def LOG_SOFTMAX() -> Workload:
    return _workload("zoo_log_softmax", "log_softmax outputs with nll_loss", LogSoftmax, loss=F.nll_loss)


def INT_FORWARD() -> Workload:
    return _workload("zoo_int_forward", "integer positions and masks made in forward", IntForward,
                     make_data=_padded)


def DATA_BRANCH() -> Workload:
    return _workload("zoo_data_branch", "a branch on a tensor's value", DataBranch)


def TRANSFORMER_SUBCLASS() -> Workload:
    return _workload("zoo_transformer_subclass", "nn.Transformer subclass, sequence-first, causal float mask",
                     lambda: TransformerSubclass(VOCAB, D, 2, 2 * D, 1, dropout=0.0), loss=F.nll_loss, lr=3e-3)


def CUSTOM_LAYERNORM() -> Workload:
    return _workload("zoo_custom_layernorm", "hand-written LayerNorm and RMSNorm modules", CustomLayerNorm)


def FUSED_QKV() -> Workload:
    return _workload("zoo_fused_qkv", "one fused qkv Linear split into heads (nanoGPT)", FusedQKV)


def DROPOUT() -> Workload:
    return _workload("zoo_dropout", "dropout everywhere (embedding, attention, residuals)", Dropout)


ALL = [NEXT_PARAMS, VIEW_BUFFERS, TIED, TUPLE_OUT, SEQ_FIRST, LOG_SOFTMAX, INT_FORWARD, DATA_BRANCH,
       TRANSFORMER_SUBCLASS, CUSTOM_LAYERNORM, FUSED_QKV, DROPOUT]
PATTERNS = {f.__name__.lower(): f for f in ALL}
