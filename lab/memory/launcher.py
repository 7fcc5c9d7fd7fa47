"""The launcher of a sharded run (``memory.shard="fsdp2"``): the data-parallel ranks, with FSDP2 where DDP would be.

Why a launcher of the memory family: what a data-parallel run wraps its model in is the launcher's ``wrap`` /
``unwrap`` (:class:`lab.technique.Launcher`), and FSDP2 replaces DDP there, nowhere else. Starting the ranks,
joining and leaving their group stay the data-parallel family's: this launcher hands those to the launcher
registered as ``distributed`` in :data:`lab.registry.LAUNCHERS` (looked up, not imported: technique packages do
not import each other). The chain asks the memory family first (:data:`lab.registry.FAMILY_ORDER`), so a sharded
run takes this launcher and every other data-parallel run DDP's. The loop is unchanged: the ranks slice the same
global batch, the optimizer is built from the sharded parameters (so its state is sharded too), and FSDP2's
all-gathers and reduce-scatters run inside forward and backward (the "comm" phase, DDP's timed all-reduce, stays
empty and ``details["distributed"]`` says so).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from torch import nn

from lab.config import RunConfig
from lab.context import TrainContext
from lab.memory.sharding import gather_model, shard_model
from lab.registry import LAUNCHERS
from lab.result import RunResult, section
from lab.technique import Launcher

#: The launcher that starts, joins and leaves the ranks (the data-parallel family's).
RANKS = "distributed"


def _ranks() -> Launcher:
    if RANKS not in LAUNCHERS:
        raise ValueError(f"memory.shard='fsdp2' needs the data-parallel launcher ({RANKS!r}) registered: import lab")
    return LAUNCHERS.get(RANKS)


def own_compile_cache(rank: int) -> str:
    """Point this rank's Inductor cache (``TORCHINDUCTOR_CACHE_DIR``, read at each compile) at a folder of its own,
    ``rank<r>`` under the shared one. Why: ranks hold shards of different sizes (rank 0 has the padded row), and
    a graph compiled on one rank for a DTensor (torchao's low-bit Adam update) was read back from the shared on-disk
    cache by the other, which then failed its size check ("expected size 17==16"); with a cache per rank (or none)
    each compiles its own and both train. Returns the folder."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    base = os.environ.get("LAB_SHARED_INDUCTOR_CACHE") or cache_dir()
    os.environ["LAB_SHARED_INDUCTOR_CACHE"] = base  # a second run in this process nests no deeper
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path = os.path.join(base, f"rank{rank}")
    return path


class ShardedLauncher(Launcher):
    """Data-parallel ranks whose model is sharded with FSDP2 (``fully_shard`` per block, then the root) instead of
    wrapped in DDP, and gathered back into a plain model after training."""

    def applies(self, cfg: RunConfig) -> bool:
        return cfg.memory.shard == "fsdp2"

    def launch(self, cfg: RunConfig, run: Callable[[RunConfig], RunResult]) -> RunResult | None:
        return _ranks().launch(cfg, run)

    def join(self, ctx: TrainContext) -> None:
        """Join the ranks' group; each rank then compiles into its own Inductor cache (:func:`own_compile_cache`)."""
        _ranks().join(ctx)
        if ctx.ddp is not None and ctx.ddp.info.distributed:
            own_compile_cache(ctx.ddp.info.rank)

    def wrap(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        """Shard ``model`` in place (each rank: its 1/N of every parameter), per block then the root."""
        if ctx.ddp is None or not ctx.ddp.info.distributed:  # check() refuses this before any work
            raise ValueError("memory.shard='fsdp2' needs several ranks: add --ddp-world-size 2")
        sharded = shard_model(model, ctx.workload.model_blocks(model), ctx.ddp.info.world_size)
        ctx.state["memory.sharded"] = sharded
        return model

    def unwrap(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        """Every rank: the plain model with the trained values (all-gathered); ``details["distributed"]`` as DDP's, its
        all-reduce figures replaced by what FSDP2 communicates."""
        sharded = ctx.state.get("memory.sharded")
        if sharded is None:
            return model
        plain = gather_model(model, sharded)
        plain = _ranks().unwrap(ctx, plain)
        rec = section(ctx.result, "distributed")
        if rec:
            rec.update(wrapper="fsdp2", bytes_per_step=None, buckets_per_step=None,
                       comm_meaning="FSDP2 all-gathers each block's parameters in forward and backward and "
                                    "reduce-scatters its gradients, inside those phases: not timed apart")
        return plain

    def leave(self, ctx: TrainContext) -> None:
        _ranks().leave(ctx)


LAUNCHER = ShardedLauncher()

__all__ = ["LAUNCHER", "RANKS", "ShardedLauncher", "own_compile_cache"]
