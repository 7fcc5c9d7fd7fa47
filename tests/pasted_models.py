"""Models as people paste them (issue 45): small models written the way public code writes them, each with the
few-line wrapper a user adds, brought to the lab by spec (``tests/pasted_models.py:NAME``) like any user's file.
Each carries one pattern the lab met a traceback on:

- ``pasted_roberta``: Hugging Face RoBERTa's embeddings, where ``forward`` computes the position ids from the
  input ids (``create_position_ids_from_input_ids``: an ``int`` mask, its ``cumsum``, a product of int tensors):
  integer tensors made inside ``forward``, which an int8 observer must never see.
- ``pasted_lstm_lm``: PyTorch's word-language-model ``RNNModel`` (LSTM), whose ``init_hidden`` reads
  ``weight = next(self.parameters())`` for the hidden state's dtype and device, every call.
- ``pasted_transformer``: the same example's ``TransformerModel``, an ``nn.Transformer`` subclass: sequence-first
  input, a float causal mask (``log(tril(ones))``), ``nn.TransformerEncoder``'s fast path, and a positional-encoding
  table registered as a buffer that is a transposed view (``pe.unsqueeze(0).transpose(0, 1)``).

Both examples return log-probabilities (``F.log_softmax``) trained with ``nll_loss``; the wrappers take the lab's
batch-first token batches and return the last position's log-probabilities. Data: the gallery's planted-mode
tokens (the label is the class token planted most often), generated from a seed. Each ``tiny`` run takes a second
or two on a 2-core CPU. Used by ``tests/e2e/test_pasted.py`` (int8) and ``tests/distributed`` (DDP).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from gallery import accuracy, planted_token_data, right_padded
from gallery_pasted import PositionalEncoding  # word_language_model's, as published
from torch import nn

from lab.workloads import Datasets, SizeSpec, Workload

VOCAB, SEQ, N_CLASSES = 12, 12, 4
PAD = 1  # RoBERTa's padding_idx: ids are shifted by 2 so that 0 and 1 are never tokens


def _tokens(spec: SizeSpec, seed: int) -> Datasets:
    return planted_token_data(spec, seed, seed_base=5000, vocab=VOCAB, seq=SEQ, n_classes=N_CLASSES, plant=4)


def _padded_tokens(spec: SizeSpec, seed: int) -> Datasets:
    """The planted tokens shifted past the padding id, the last 0-3 positions of each row padded."""
    return right_padded(_tokens(spec, seed), shift=2, pad=PAD, most=3)


# -------------------------------------------------------------------------- RoBERTa: int tensors in forward


def create_position_ids_from_input_ids(input_ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """Hugging Face ``modeling_roberta``'s, verbatim: padding keeps ``padding_idx``, tokens count from it."""
    mask = input_ids.ne(padding_idx).int()
    incremental_indices = torch.cumsum(mask, dim=1).type_as(mask) * mask
    return incremental_indices.long() + padding_idx


class RobertaLike(nn.Module):
    """RoBERTa's embeddings (word + positions from the ids + LayerNorm), one feed-forward block, a mean-pool head."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.padding_idx = PAD
        self.word_embeddings = nn.Embedding(VOCAB + 2, d, padding_idx=PAD)
        self.position_embeddings = nn.Embedding(SEQ + 2, d, padding_idx=PAD)
        self.LayerNorm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, N_CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        position_ids = create_position_ids_from_input_ids(input_ids, self.padding_idx)
        h = self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(position_ids))
        h = h + self.ff(h)
        return self.head(h.mean(1))


# -------------------------------------------------- PyTorch examples: word_language_model's RNN and Transformer


class RNNModel(nn.Module):
    """word_language_model's ``RNNModel`` (LSTM), as published: encoder, recurrent module, decoder."""

    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout if nlayers > 1 else 0.0)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, input: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


class LSTMLanguageModel(RNNModel):
    """The user's wrapper: batch-first tokens in, the last position's log-probabilities out."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.init_hidden(tokens.shape[0])
        logp, _ = super().forward(tokens.t(), hidden)
        return logp.view(tokens.shape[1], tokens.shape[0], -1)[-1]


class TransformerModel(nn.Transformer):
    """word_language_model's ``TransformerModel``, as published (its ``decoder`` is the output Linear)."""

    def __init__(self, ntoken: int, ninp: int, nhead: int, nhid: int, nlayers: int, dropout: float = 0.5) -> None:
        super().__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers,
                         dropout=dropout)
        self.model_type = "Transformer"
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout, max_len=64)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        self.init_weights()

    def _generate_square_subsequent_mask(self, sz: int) -> torch.Tensor:
        return torch.log(torch.tril(torch.ones(sz, sz)))

    def init_weights(self) -> None:
        initrange = 0.1
        nn.init.uniform_(self.input_emb.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src: torch.Tensor, has_mask: bool = True) -> torch.Tensor:
        if has_mask:
            device = src.device
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                mask = self._generate_square_subsequent_mask(len(src)).to(device)
                self.src_mask = mask
        else:
            self.src_mask = None
        src = self.input_emb(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.encoder(src, mask=self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)


class NextTokenTransformer(TransformerModel):
    """The user's wrapper: batch-first tokens in, the last position's log-probabilities out."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens.t())[-1]


# ------------------------------------------------------------------------------------------------ workloads


def _workload(name: str, description: str, make_data, make_model, loss, lr: float = 1e-2) -> Workload:
    spec = SizeSpec(n_train=256, n_test=64, batch_size=32, epochs=2, lr=lr)
    return Workload(name=name, description=description, sizes={"tiny": spec, "small": spec, "full": spec},
                    make_data=make_data, make_model=make_model, loss=loss, evaluate=accuracy,
                    metric_name="accuracy")


def ROBERTA() -> Workload:
    return _workload("pasted_roberta", "RoBERTa embeddings: position ids computed from the input ids in forward",
                     _padded_tokens, lambda spec: RobertaLike(), F.cross_entropy)


def LSTM_LM() -> Workload:
    return _workload("pasted_lstm_lm", "word_language_model RNNModel: init_hidden reads next(self.parameters())",
                     _tokens, lambda spec: LSTMLanguageModel(VOCAB, 16, 32, 1, dropout=0.0), F.nll_loss)


def TRANSFORMER() -> Workload:
    return _workload("pasted_transformer", "word_language_model TransformerModel: nn.Transformer subclass, "
                     "sequence-first, causal float mask, a transposed-view buffer", _tokens,
                     lambda spec: NextTokenTransformer(VOCAB, 16, 2, 32, 2, dropout=0.0), F.nll_loss, lr=3e-3)


ALL = [ROBERTA, LSTM_LM, TRANSFORMER]
