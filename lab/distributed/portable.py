"""Data-parallel training as plain PyTorch (``python -m lab recipe``, :mod:`lab.portable`): the script runs as one
process (``python FILE``) or as ``ddp.world_size`` ranks under ``torchrun``, which sets ``RANK`` / ``WORLD_SIZE`` /
``MASTER_ADDR`` for each; a rank joins the process group, reads its share of every epoch through a
``DistributedSampler`` and trains a ``DistributedDataParallel`` wrap of the model (one all-reduce of the gradients
per step, overlapped with backward). The per-rank batch is ``batch_size``, as in the lab, so the effective batch
grows with the ranks. After training rank 0 alone finishes (pruning, int8), as a lab run does.

Where it differs from the lab: the lab's ranks slice one shuffled global batch (:class:`lab.distributed.ddp.
RankSlicedLoader`); ``DistributedSampler`` deals every rank a strided share of one shuffled order. Both give each
rank ``batch_size`` rows of a different part of the data per step.
"""

from __future__ import annotations

from lab.config import RunConfig
from lab.result import RunResult
from lab.technique import NotPortable, Portable, refuse_accumulation


def portable(cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
    """``init_process_group`` / ``DistributedSampler`` / ``DistributedDataParallel``, started by torchrun."""
    dc = cfg.ddp
    if not dc.enabled:
        return None
    refuse_accumulation("ddp.grad_accum_steps", dc.grad_accum_steps, "(no_sync on all but the last micro-batch)")
    if dc.shard != "batch":
        raise NotPortable(f"ddp.shard={dc.shard!r}: per-rank shards cut {dc.shard} are the lab's sharding study, "
                          "not written out by the recipe (DistributedSampler deals strided shares)")
    backend = "\"gloo\" if device.type == \"cpu\" else \"nccl\"" if dc.backend == "auto" else repr(dc.backend)
    # A sharded run (memory.shard, FSDP2) wraps the model in the memory family's part, as its launcher does in a
    # run: this part starts the ranks, deals the data and leaves the group, and writes no DDP.
    sharded = cfg.memory.shard != "none"
    bucket = "" if dc.bucket_cap_mb == 25.0 else f", bucket_cap_mb={dc.bucket_cap_mb!r}"
    return Portable(
        comment=f"data-parallel over {dc.world_size} ranks: torchrun starts them, DistributedSampler deals each its "
                "share, " + ("FSDP2 (the memory part) shards the model" if sharded else
                             "DDP all-reduces the gradients during backward"),
        imports=("import datetime", "import os", "import torch.distributed as dist",
                 "from torch.nn.parallel import DistributedDataParallel as DDP",
                 "from torch.utils.data.distributed import DistributedSampler"),
        setup=("distributed = int(os.environ.get(\"WORLD_SIZE\", \"1\")) > 1  # set by torchrun",
               "if distributed:",
               f"    dist.init_process_group({backend}, timeout=datetime.timedelta(seconds={dc.timeout_s:g}))",
               "    if device.type == \"cuda\":",
               "        device = torch.device(\"cuda\", int(os.environ[\"LOCAL_RANK\"]))",
               "        torch.cuda.set_device(device)",
               "sampler = DistributedSampler(train_set, shuffle=shuffle, seed=seed, drop_last=True) if distributed "
               "else None"),
        loader_kwargs=(("shuffle", "shuffle and sampler is None"), ("sampler", "sampler")),
        wrap=() if sharded else (
            "if distributed:  # after the loader, before the optimizer sees the parameters",
            f"    model = DDP(model, device_ids=[device.index] if device.type == \"cuda\" else None{bucket})"),
        epoch_start=("if isinstance(getattr(loader, \"sampler\", None), DistributedSampler):",
                     "    loader.sampler.set_epoch(epoch)  # a new order every epoch, the same on every rank"),
        unwrap=("if distributed:",
                "    rank = dist.get_rank()" if sharded else "    model, rank = model.module, dist.get_rank()",
                "    dist.barrier()",
                "    dist.destroy_process_group()",
                "    if rank != 0:",
                "        return model, losses  # rank 0 alone finishes (pruning, int8), as the lab does"),
        launch=f"torchrun --nproc_per_node={dc.world_size} {{file}}",
        notes=("the lab's ranks slice one shuffled global batch; DistributedSampler deals each rank a strided share "
               "of one shuffled order (each rank: batch_size rows of another part of the data per step)",))


__all__ = ["portable"]
