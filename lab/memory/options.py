"""The memory family's option strings: what a step keeps, not how fast it runs."""

from __future__ import annotations

from lab.technique import TRAINING, Option, register_options

register_options(
    Option("checkpoint_blocks", {"memory.checkpoint": "blocks"}, "memory",
           "activation checkpointing per block: each block's activations recomputed in backward (less memory, one "
           "more forward of the blocks)", axes=TRAINING),
    Option("adam8bit", {"memory.optimizer_state": "int8"}, "memory",
           "Adam's moments in 8 bits (torchao AdamW8bit): ~4x fewer optimizer-state bytes; compiles on its first "
           "step", axes=TRAINING),
    Option("adam4bit", {"memory.optimizer_state": "int4"}, "memory",
           "Adam's moments in 4 bits (torchao AdamW4bit): ~8x fewer optimizer-state bytes; compiles on its first "
           "step", axes=TRAINING),
    Option("accum2", {"memory.micro_batches": 2}, "memory",
           "gradient accumulation keeping the batch: each batch as 2 micro-batches (half the activations alive at "
           "once, two smaller forward + backward passes)", axes=TRAINING),
    Option("accum4", {"memory.micro_batches": 4}, "memory",
           "gradient accumulation keeping the batch: each batch as 4 micro-batches (a quarter of the activations "
           "alive at once, four smaller forward + backward passes)", axes=TRAINING),
    Option("fsdp2", {"memory.shard": "fsdp2"}, "memory",
           "FSDP2 sharding (fully_shard per block, then the root): each of N data-parallel ranks keeps ~1/N of the "
           "parameters, gradients and optimizer state instead of DDP's full copy; needs --ddp-world-size 2 or more",
           axes=TRAINING),
    Option("offload_optim", {"memory.offload": "optimizer"}, "memory",
           "CPU offload of the optimizer (torchao CPUOffloadOptimizer): Adam's state and update in host memory, no "
           "optimizer state on the GPU; each step copies the gradients to the host and the parameters back; CUDA "
           "only", axes=TRAINING),
)
