"""The ctr model: DLRM with a Wide&Deep linear part, and its ``index_select`` fast path (``compute.fast_kernels``).

The interaction is a pairwise ``bmm`` between the bottom MLP's output and the embeddings, so the bottom MLP's
last layer must keep ``embed_dim`` outputs: :func:`prune_scopes` tells structured pruning to prune each MLP
as its own graph (the workload's hook, so no technique package has to know this class).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn


def _mlp(sizes: Sequence[int], final_act: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if final_act or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM with a wide part: one shared ``EmbeddingBag`` (per-field offsets, bags of one), a bottom MLP for
    the dense features, pairwise dot interactions (what the planted FM term needs), a top MLP, plus a
    Wide&Deep-style linear term over all fields.
    ``forward(dense [B, n_dense], cat [B, n_cat]) -> logits [B]``.
    """

    def __init__(self, vocab: Sequence[int], n_dense: int = 13, embed_dim: int = 16,
                 bottom: Sequence[int] = (64,), top: Sequence[int] = (128, 64)) -> None:
        super().__init__()
        n_cat = len(vocab)
        offsets = torch.tensor([0, *np.cumsum(vocab)[:-1].tolist()], dtype=torch.int64)
        self.register_buffer("offsets", offsets, persistent=False)
        self.embedding = nn.EmbeddingBag(int(sum(vocab)), embed_dim, mode="sum")
        self.wide = nn.EmbeddingBag(int(sum(vocab)), 1, mode="sum")
        self.bottom = _mlp([n_dense, *bottom, embed_dim], final_act=True)
        n_vec = n_cat + 1
        iu = torch.triu_indices(n_vec, n_vec, offset=1)
        self.register_buffer("iu", iu, persistent=False)
        self.top = _mlp([embed_dim + iu.shape[1], *top, 1], final_act=False)
        # Small embeddings (DLRM's uniform(±1/sqrt(n)) spirit): N(0, 1) ones make the dot products explode.
        nn.init.normal_(self.embedding.weight, std=0.05)
        nn.init.zeros_(self.wide.weight)
        self.register_buffer("iu_flat", iu[0] * n_vec + iu[1], persistent=False)
        #: ``compute.fast_kernels``: the same lookups and pair selection through ``index_select``, whose
        #: backward is a plain ``index_add_``; EmbeddingBag's backward sorts every index and advanced
        #: indexing's backward is an accumulating ``index_put_``. Same math, same parameters.
        self.gather_kernels = False

    def _fast_path(self) -> bool:
        # Only while the lookups are the plain float modules: a quantized EmbeddingBag has no ``.weight``.
        return self.gather_kernels and type(self.embedding) is nn.EmbeddingBag and type(self.wide) is nn.EmbeddingBag

    def forward(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        b, n_cat = cat.shape
        idx = cat + self.offsets
        fast = self._fast_path()
        if fast:
            emb = self.embedding.weight.index_select(0, idx.reshape(-1)).reshape(b, n_cat, -1)
        else:
            emb = self.embedding(idx.reshape(-1, 1)).reshape(b, n_cat, -1)
        x = self.bottom(dense)
        vecs = torch.cat([x.unsqueeze(1), emb], dim=1)
        gram = torch.bmm(vecs, vecs.transpose(1, 2))
        if fast:
            dots = gram.flatten(1).index_select(1, self.iu_flat)
            wide = self.wide.weight.reshape(-1).index_select(0, idx.reshape(-1)).reshape(b, n_cat).sum(1)
        else:
            dots = gram[:, self.iu[0], self.iu[1]]
            wide = self.wide(idx).squeeze(-1)
        deep = self.top(torch.cat([x, dots], dim=1)).squeeze(-1)
        return deep + wide


def use_gather_kernels(model: nn.Module) -> nn.Module:
    """``compute.fast_kernels`` for ctr: switch a :class:`DLRM` to its ``index_select`` lookups."""
    if not isinstance(model, DLRM):
        raise TypeError(f"fast kernels need the ctr DLRM, got {type(model).__name__}")
    model.gather_kernels = True
    return model


def _output_layer(module: nn.Module) -> nn.Module | None:
    last = None
    for m in module.modules():
        if isinstance(m, nn.Linear):
            last = m
    return last


def prune_scopes(model: nn.Module) -> list[tuple[str, nn.Module, list[nn.Module]]]:
    """``Workload.prune_scopes`` for ctr: the bottom and top MLPs, each traced alone with its last layer's
    width fixed (the bottom one meets the embeddings in the ``bmm``; the top one is the logit)."""
    if not isinstance(model, DLRM):
        raise TypeError(f"ctr prune scopes need the ctr DLRM, got {type(model).__name__}")
    return [("bottom", model.bottom, [_output_layer(model.bottom)]), ("top", model.top, [_output_layer(model.top)])]
