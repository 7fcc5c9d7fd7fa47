"""FSDP2 sharding: each of N ranks keeps 1/N of the parameters, of their gradients and of the optimizer's state
(``torch.distributed.fsdp.fully_shard``), where DistributedDataParallel keeps all of them on every rank.

Why per block, then the root: ``fully_shard`` makes one communication group of the parameters of the module it is
given that no earlier call took, so calling it bottom-up on the workload's blocks
(:meth:`lab.workloads.Workload.model_blocks`, the same blocks activation checkpointing recomputes) and then on the
root gives one all-gather / reduce-scatter per block: a block's full parameters exist only while it runs forward
and backward (``reshard_after_forward``: freed after its forward, gathered again for its backward), and the root's
(embeddings, head) stay gathered from forward to backward (FSDP2's default for the root). A model without blocks
is one group, still sharded at rest. Each rank's sharded parameter is a ``DTensor`` whose local tensor is the
rank's rows of dim 0 (padded to equal shards), so ``torch.optim.Adam`` keeps its moments in the same shards.

Why a plain model after training: the run evaluates, prunes and quantizes on rank 0 alone, after the ranks left
their group; a sharded module's forward all-gathers and would wait for peers that are gone. :func:`shard_model`
keeps a *skeleton* of the model (a deep copy whose parameters and buffers are meta tensors: the structure, no
bytes) and :func:`gather_model` fills it with the trained full tensors (``DTensor.full_tensor``, a collective every
rank runs) and returns it; a tied weight stays one parameter.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class Sharded:
    """What :func:`shard_model` did: the skeleton :func:`gather_model` fills, and the groups it made."""

    skeleton: nn.Module
    blocks: list[str]  # names of the modules sharded as their own group (the root is one more)
    world_size: int


def meta_skeleton(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are meta tensors (no storage): the deep copy's memo
    maps each tensor to its meta twin, so nothing is copied but the structure (and small non-tensor state), and a
    tied weight stays tied."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        if id(p) not in memo:
            memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        if id(b) not in memo:
            memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def shard_model(model: nn.Module, blocks: list[nn.Module], world_size: int) -> Sharded:
    """Shard ``model`` in place across the default process group: ``fully_shard`` on each of ``blocks`` (modules
    of ``model``), then on ``model``. Its skeleton is taken first (:func:`meta_skeleton`)."""
    from torch.distributed.fsdp import fully_shard

    names = {id(m): n for n, m in model.named_modules()}
    missing = [type(b).__name__ for b in blocks if id(b) not in names]
    if missing:
        raise ValueError(f"{', '.join(missing)} is not a module of the model: a workload's blocks must be modules of "
                         "the model it is given")
    skeleton = meta_skeleton(model)
    inner_first = sorted(blocks, key=lambda b: -names[id(b)].count("."))  # bottom-up, if a workload nests blocks
    for block in inner_first:
        fully_shard(block)
    fully_shard(model)
    return Sharded(skeleton, [names[id(b)] for b in blocks], world_size)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t`` (a ``DTensor``'s local shard; any other tensor itself)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def gather_model(model: nn.Module, sharded: Sharded) -> nn.Module:
    """The plain model with ``model``'s trained values: every rank all-gathers every parameter
    (``full_tensor``, collective: call it on every rank, in the group) and fills the skeleton; buffers (FSDP2
    leaves them unsharded) are copied. ``model`` is left sharded; drop it."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()  # a root gathered by an evaluation's forward holds plain tensors until its next backward
    with torch.no_grad():
        full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach() for n, p in model.named_parameters()}
    buffers = dict(model.named_buffers())
    skeleton = sharded.skeleton
    names = {id(t): n for n, t in (*skeleton.named_parameters(), *skeleton.named_buffers())}  # each tensor's first name
    made: dict[int, torch.Tensor] = {}
    for module in skeleton.modules():
        for key, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in made:
                    made[id(p)] = nn.Parameter(full[names[id(p)]], requires_grad=p.requires_grad)
                module._parameters[key] = made[id(p)]
        for key, b in list(module._buffers.items()):
            if b is not None:
                if id(b) not in made:
                    made[id(b)] = buffers[names[id(b)]].detach()
                module._buffers[key] = made[id(b)]
    return skeleton


__all__ = ["Sharded", "gather_model", "local_tensor", "meta_skeleton", "shard_model"]
