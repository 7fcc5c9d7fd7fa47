"""The compute family's option strings: the same math, executed differently."""

from __future__ import annotations

from lab.technique import TRAINING, Option, register_options

register_options(
    Option("fused_optim", {"compute.fused_optimizer": True}, "compute",
           "fused Adam/SGD: one kernel per dtype instead of a loop of small ones", axes=TRAINING),
    Option("fast_kernels", {"compute.fast_kernels": True}, "compute",
           "the workload's faster implementation of the same math (ctr: index_select lookups)",
           axes=(*TRAINING, "inference")),
    Option("compile", {"compute.compile": True}, "compute",
           "torch.compile the training forward; compile time counts in training time", axes=TRAINING),
)
