"""The memory family as plain PyTorch (``python -m lab recipe``, :mod:`lab.portable`): activation checkpointing per
block (``torch.utils.checkpoint``, non-reentrant), Adam's moments in 8 / 4 bits (torchao's ``AdamW8bit`` /
``AdamW4bit`` in place of ``torch.optim.Adam``) and FSDP2 sharding (``fully_shard`` per block, then the root, where
the data-parallel part would wrap the model in DDP; the data-parallel part still starts the ranks, deals the data
and leaves the group). CPU offload of the optimizer is not written: every recipe file is checked against the lab's
run on a CPU, where torchao's ``CPUOffloadOptimizer`` cannot run (docs/memory.md gives its one line).

What a block is comes from the user's model here, not from a workload: the script finds it the way the lab's
default does (:func:`lab.workloads.base.default_blocks`: the layers Hugging Face marks as checkpointable, else the
outermost members with parameterised children of an ``nn.Sequential`` / ``nn.ModuleList`` / ``nn.ModuleDict``), and
says so where a model has none. A checkpointed block recomputes BatchNorm at momentum 0, as the lab's does
(:mod:`lab.memory.checkpointing`), so its running statistics move once per step.
"""

from __future__ import annotations

from lab.config import RunConfig
from lab.config.memory import MemoryConfig
from lab.memory.optim import LOW_BIT
from lab.result import RunResult
from lab.technique import NotPortable, Portable, refuse_accumulation

FIND_BLOCKS = '''def find_blocks(model):
    """The model's blocks: the layers Hugging Face marks as checkpointable, else the outermost members with
    parameterised children of an nn.Sequential / nn.ModuleList / nn.ModuleDict (a transformer layer, a residual
    block). A lone nn.Linear is no block: checkpointing it keeps its input, which its backward needs anyway."""
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)

    def marked(m):
        for child in m.children():
            if any(c.__name__ == "GradientCheckpointingLayer" for c in type(child).__mro__):
                yield child
            else:
                yield from marked(child)

    def composite(m):
        for child in m.children():
            if isinstance(m, containers) and not isinstance(child, containers) and any(
                    any(True for _ in sub.parameters()) for sub in child.children()):
                yield child
            else:
                yield from composite(child)

    return list(marked(model)) or list(composite(model))'''

CHECKPOINT_BLOCKS = '''def checkpoint_blocks(model):
    """Activation checkpointing per block, in place: a block keeps only its inputs for backward and runs forward
    again when backward reaches it (torch.utils.checkpoint, non-reentrant). BatchNorm in a block recomputes at
    momentum 0, so its running statistics move once per step. Returns the blocks (restore_blocks undoes it)."""
    blocks = find_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no blocks to checkpoint (no module with parameterised "
                         "children held by an nn.Sequential / nn.ModuleList)")
    for block in blocks:
        block.forward = checkpointed_forward(block, block.forward)
    return blocks


def checkpointed_forward(block, plain):
    norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]

    @contextlib.contextmanager
    def recompute():  # normalise by the batch, leave the running statistics (and the batch count) as they are
        saved = [(bn.momentum, bn.num_batches_tracked.clone()) for bn in norms]
        for bn in norms:
            bn.momentum = 0.0
        try:
            yield
        finally:
            for bn, (momentum, count) in zip(norms, saved, strict=True):
                bn.momentum = momentum
                bn.num_batches_tracked.copy_(count)

    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation: nothing is saved for backward
            return plain(*args, **kwargs)
        extra = {"context_fn": lambda: (contextlib.nullcontext(), recompute())} if norms else {}
        return checkpoint(plain, *args, use_reentrant=False, **extra, **kwargs)

    return forward


def restore_blocks(model):
    """Undo checkpoint_blocks: every block runs its own forward again."""
    for block in find_blocks(model):
        block.__dict__.pop("forward", None)'''

RESIDUAL = '''class Residual(nn.Module):
    """The placeholder model's block, x + MLP(x): checkpointing needs blocks (yours take its place)."""

    def __init__(self, width):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, x):
        return x + self.net(x)'''

GATHER = '''def meta_copy(model):
    """The model's structure without its bytes: a deep copy whose parameters and buffers are meta tensors."""
    memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
            for p in model.parameters()}
    memo.update({id(b): torch.empty_like(b, device="meta") for b in model.buffers()})
    return copy.deepcopy(model, memo)


def gather_model(model, skeleton):
    """Every rank: the plain model with the sharded model's trained values (all-gathered; a tied weight stays one
    parameter), for what runs on rank 0 alone after the group is gone."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
    with torch.no_grad():
        full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach() for n, p in model.named_parameters()}
    buffers = dict(model.named_buffers())
    names = {id(t): n for n, t in (*skeleton.named_parameters(), *skeleton.named_buffers())}
    made = {}
    for module in skeleton.modules():
        for key, p in list(module._parameters.items()):
            if p is not None:
                made.setdefault(id(p), nn.Parameter(full[names[id(p)]], requires_grad=p.requires_grad))
                module._parameters[key] = made[id(p)]
        for key, b in list(module._buffers.items()):
            if b is not None:
                made.setdefault(id(b), buffers[names[id(b)]].detach())
                module._buffers[key] = made[id(b)]
    return skeleton'''


def refuse_unwritten(mc: MemoryConfig) -> None:
    """What the recipe does not write, each refused by name (:class:`NotPortable`): accumulation that keeps the
    batch (the lab's own loop splits it); CPU offload (every file the recipe writes is run against the lab's run
    on a CPU, where torchao's ``CPUOffloadOptimizer`` cannot run, so a written line would go unchecked); FSDP2 with
    low-bit state (torchrun's ranks would share one Inductor cache, from which a rank read a graph compiled for
    another rank's shard size and failed; a lab run gives each rank its own cache)."""
    refuse_accumulation("memory.micro_batches", mc.micro_batches, "that keeps the batch")
    if mc.offload != "none":
        raise NotPortable(f"memory.offload={mc.offload!r}: torchao's CPUOffloadOptimizer runs on CUDA only and every "
                          "recipe file is checked against the lab's run on a CPU; its one line is in docs/memory.md")
    if mc.shard != "none" and mc.optimizer_state != "fp32":
        raise NotPortable(f"memory.shard={mc.shard!r} with memory.optimizer_state={mc.optimizer_state!r}: torchrun's "
                          "ranks would share one on-disk Inductor cache (a rank read another's graph, compiled for "
                          "its shard size, and failed here); not written out by the recipe yet")


def portable(cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
    """The family's part: checkpointing's helpers and wrap, torchao's optimizer, FSDP2's shard and gather."""
    mc = cfg.memory
    if not mc.enabled:
        return None
    refuse_unwritten(mc)
    comments, imports, helpers, wrap, unwrap, notes = [], [], [], [], [], []
    requires: tuple[str, ...] = ()
    optimizer = placeholder = None
    if mc.checkpoint == "blocks":
        comments.append("each block keeps only its inputs; backward runs its forward again (torch.utils.checkpoint, "
                        "non-reentrant)")
        imports += ["import contextlib", "from torch.utils.checkpoint import checkpoint"]
        helpers += [FIND_BLOCKS, CHECKPOINT_BLOCKS, RESIDUAL]
        placeholder = "nn.Sequential(nn.Linear(32, 64), Residual(64), Residual(64), nn.ReLU(), nn.Linear(64, 10))"
        wrap += ["checkpoint_blocks(model)  # raises where the model has no blocks, as the lab refuses it"]
        unwrap += ["restore_blocks(model)  # a training-time lever: what follows runs the plain model"]
        notes.append("checkpointing finds the blocks in your model as the lab's default does (a workload of the lab "
                     "may name its own blocks: Workload(blocks=fn))")
    if mc.optimizer_state != "fp32":
        cls = LOW_BIT[mc.optimizer_state]
        bits = {"int8": 8, "int4": 4}[mc.optimizer_state]
        comments.append(f"Adam's moments in {bits} bits, block-quantized (torchao {cls}; weight decay 0: Adam's "
                        "update); compiles its update on the first step")
        imports.append(f"from torchao.optim import {cls}")
        requires = ("torchao",)
        optimizer = f"{cls}({{params}}, lr=lr, weight_decay=0.0)"
        notes.append(f"{cls} keeps fp32 moments for tensors under 4,096 values (biases, norms), as torchao does")
    if mc.shard == "fsdp2":
        if cfg.ddp.grad_accum_steps > 1:
            raise NotPortable("memory.shard='fsdp2' with ddp.grad_accum_steps > 1: accumulation is not written out "
                              "by the recipe yet")
        comments.append(f"FSDP2: each of the {cfg.ddp.world_size} ranks keeps 1/{cfg.ddp.world_size} of the "
                        "parameters, gradients and Adam state (fully_shard per block, then the root) instead of "
                        "DDP's full copy; gathered back into a plain model after training")
        imports += ["import copy", "from torch.distributed.fsdp import FSDPModule, fully_shard",
                    "from torch.distributed.tensor import DTensor"]
        helpers += [FIND_BLOCKS, GATHER]
        wrap += ["if distributed:  # FSDP2 where DDP would wrap: per block (one all-gather each), then the root",
                 "    skeleton = meta_copy(model)",
                 *(["    restore_blocks(skeleton)  # the copy's forwards would call the sharded blocks'"]
                   if mc.checkpoint == "blocks" else []),
                 "    for block in find_blocks(model):",
                 "        fully_shard(block)",
                 "    fully_shard(model)  # the optimizer below is built from the shards: its state is sharded too"]
        unwrap += ["if distributed:",
                   "    model = gather_model(model, skeleton)  # collective: every rank, before leaving the group"]
        notes.append("without torchrun (one process) there is nobody to shard with: the script trains the plain "
                     "model")
    return Portable(comment="; ".join(comments), imports=tuple(imports), requires=requires,
                    helpers=tuple(dict.fromkeys(helpers)), wrap=tuple(wrap), optimizer=optimizer,
                    unwrap=tuple(unwrap), placeholder=placeholder, notes=tuple(notes))


__all__ = ["CHECKPOINT_BLOCKS", "FIND_BLOCKS", "GATHER", "RESIDUAL", "portable"]
