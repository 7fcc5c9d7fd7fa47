"""The memory family's config: levers that lower a training step's memory (:mod:`lab.memory`, docs/memory.md).

One module per family's config (:mod:`lab.config.families` lists them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lab.config.checks import check_choice, check_int
from lab.config.family import _Family


@dataclass(frozen=True, kw_only=True)
class MemoryConfig(_Family):
    """``checkpoint="blocks"`` recomputes each of the model's blocks (``Workload.model_blocks``) in backward instead of
    keeping its activations (``torch.utils.checkpoint``, non-reentrant); ``optimizer_state`` keeps Adam's two
    moments in 8 or 4 bits (torchao's ``AdamW8bit`` / ``AdamW4bit`` at weight decay 0: Adam's update) instead of
    fp32; ``micro_batches`` runs each batch as that many micro-batches, gradients accumulated (the same effective
    batch, a micro-batch's activations); ``shard="fsdp2"`` shards the parameters, gradients and optimizer state
    across the data-parallel ranks (``torch.distributed.fsdp.fully_shard`` per block, then the root) where DDP
    replicates them (needs ``ddp.world_size`` >= 2); ``offload="optimizer"`` keeps Adam's state and runs its update
    in host memory while the parameters stay on the GPU (torchao's ``CPUOffloadOptimizer``; CUDA only). None
    changes the model: checkpointing, sharding and offload give the plain run's losses and gradients up to float
    rounding, low-bit state an Adam whose moments are rounded."""

    family: ClassVar[str] = "memory"
    SWITCH: ClassVar[str] = ("memory.checkpoint other than 'none', memory.optimizer_state other than 'fp32' or "
                             "memory.micro_batches > 1, memory.shard other than 'none' or memory.offload other "
                             "than 'none'")
    CHECKPOINTS: ClassVar[tuple[str, ...]] = ("none", "blocks")
    OPTIMIZER_STATES: ClassVar[tuple[str, ...]] = ("fp32", "int8", "int4")
    SHARDS: ClassVar[tuple[str, ...]] = ("none", "fsdp2")
    OFFLOADS: ClassVar[tuple[str, ...]] = ("none", "optimizer")
    ALLOWED: ClassVar[dict[str, tuple[str, ...]]] = {
        "checkpoint": CHECKPOINTS, "optimizer_state": OPTIMIZER_STATES, "shard": SHARDS, "offload": OFFLOADS}
    HELP: ClassVar[dict[str, str]] = {
        "checkpoint": "activation checkpointing: blocks recomputes each of the model's blocks in backward instead "
                      "of keeping its activations (fewer saved bytes, one more forward of the blocks); none: off",
        "optimizer_state": "Adam's moments in fp32, or block-quantized in int8 / int4 (torchao AdamW8bit / "
                           "AdamW4bit: about 4x / 8x fewer bytes; needs --optimizer adam)",
        "micro_batches": "gradient accumulation that keeps the batch: each batch runs as this many micro-batches "
                         "(its rows cut evenly), gradients summed before one optimizer step: the activations of "
                         "batch / this, one forward + backward per micro-batch (1: off)",
        "shard": "fsdp2: shard parameters, gradients and optimizer state across the data-parallel ranks (FSDP2 "
                 "fully_shard per block, then the root; each rank keeps about 1/N) instead of DDP's full copy per "
                 "rank; needs --ddp-world-size 2 or more; none: off",
        "offload": "optimizer: Adam's state kept and stepped in host memory, parameters on the GPU, each step's "
                   "gradients copied to the host and the updated parameters back (torchao CPUOffloadOptimizer: no "
                   "optimizer state on the GPU; needs CUDA and --optimizer adam); none: off",
    }

    checkpoint: str = "none"
    optimizer_state: str = "fp32"
    micro_batches: int = 1
    shard: str = "none"
    offload: str = "none"

    def __post_init__(self) -> None:
        check_choice(self._name("checkpoint"), self.checkpoint, self.CHECKPOINTS)
        check_choice(self._name("optimizer_state"), self.optimizer_state, self.OPTIMIZER_STATES)
        check_int(self._name("micro_batches"), self.micro_batches, lo=1, hi=4096)
        check_choice(self._name("shard"), self.shard, self.SHARDS)
        check_choice(self._name("offload"), self.offload, self.OFFLOADS)
        self._refuse_when_off()

    @property
    def enabled(self) -> bool:
        return (self.checkpoint != "none" or self.optimizer_state != "fp32" or self.micro_batches > 1
                or self.shard != "none" or self.offload != "none")

