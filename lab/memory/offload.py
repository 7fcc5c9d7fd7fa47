"""CPU offload of the optimizer (``memory.offload="optimizer"``): Adam's state and its update live in host memory
(torchao's ``CPUOffloadOptimizer``), the parameters stay on the GPU.

Why: Adam keeps two fp32 moments per parameter, twice the parameters' own bytes, on the device that trains. Where
the GPU's memory is what runs out and the host has plenty, the moments can live on the host: each parameter's
gradient is copied to pinned host memory as backward produces it (a side stream, overlapping the rest of
backward), the host steps torch's fused CPU AdamW on a pinned host copy of the parameter, and the updated values
are copied back before the next forward. The GPU then keeps parameters, gradients and activations, and no
optimizer state. What it costs: two PCIe transfers of every parameter's bytes per step and the host's Adam.

Choices made here: weight decay 0, so the update is Adam's (the lab's default optimizer), as the low-bit path's
AdamW is; ``minimal_size=0``, so every trainable tensor is offloaded: torchao keeps tensors under 4,096 values on
the device by default (fewer small transfers), which would leave a small model's whole state where it was and
make the lever's claim (no optimizer state on the device) untrue. Gradients stay on the device too (torchao's
``offload_gradients`` is not wired: the lab's accumulation and its count of gradient bytes read them there).

On a CPU run the state already is in host memory: :func:`check_offload` refuses it there, and torchao itself
asserts CUDA (or XPU) when the optimizer is built.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import nn

from lab.config import RunConfig
from lab.context import resolve_device
from lab.measure.memory import tensor_bytes
from lab.memory.optim import OptimizerFactory


def check_offload(cfg: RunConfig) -> None:
    """``memory.offload='optimizer'``, before any work: what cannot run with it refused by name, in one line each;
    the CPU device last (a config's own conflicts are named on any machine)."""
    if cfg.memory.offload == "none":
        return
    what = f"memory.offload={cfg.memory.offload!r} is invalid"
    if cfg.optimizer != "adam":
        raise ValueError(f"{what} with optimizer={cfg.optimizer!r}: the offloaded step is Adam's (torch's AdamW at "
                         "weight decay 0 on the host); use --optimizer adam")
    if cfg.memory.optimizer_state != "fp32":
        raise ValueError(f"{what} with memory.optimizer_state={cfg.memory.optimizer_state!r}: both change where "
                         "and how Adam's moments are kept (host fp32 / device low-bit) and the pair is not wired or "
                         "verified here; choose one")
    if cfg.memory.shard != "none":
        raise ValueError(f"{what} with memory.shard={cfg.memory.shard!r}: torchao's CPUOffloadOptimizer is "
                         "single-GPU; FSDP2 has its own CPUOffloadPolicy, not wired here")
    if cfg.ddp.world_size > 1:
        raise ValueError(f"{what} with ddp.world_size={cfg.ddp.world_size}: torchao's CPUOffloadOptimizer is "
                         "single-GPU: it copies each gradient to the host as autograd accumulates it, before DDP's "
                         "all-reduce has averaged it")
    if cfg.compute.fused_optimizer:
        raise ValueError(f"{what} with compute.fused_optimizer: the offloaded update already is torch's fused "
                         "AdamW, on the host; there is no device update left to fuse; choose one")
    if cfg.precision.dtype in ("fp16", "auto"):
        raise ValueError(f"{what} with precision.dtype={cfg.precision.dtype!r}: fp16's GradScaler (auto may choose "
                         "fp16) unscales and checks the device gradients after they were copied to the host, so the "
                         "host would step on scaled gradients; use --precision bf16 or fp32")
    if cfg.checkpoint_every is not None or cfg.resume is not None:
        raise ValueError(f"{what} with checkpoint_every / resume: the offloaded optimizer copies the parameters to "
                         "the host when it is built, before a resume loads the model's weights, so its first step "
                         "would write the stale copy back (and its state dict is torchao's per-parameter list, not "
                         "Adam's)")
    if importlib.util.find_spec("torchao") is None:
        raise ValueError(f"{what} without torchao (pip install torchao): its CPUOffloadOptimizer does the offload")
    if resolve_device(cfg.device).type != "cuda":
        raise ValueError(f"{what} on device {str(resolve_device(cfg.device))!r}: memory.offload='optimizer' needs "
                         "CUDA: torchao's CPUOffloadOptimizer moves the optimizer state to host memory and steps it "
                         "there; on a CPU run the state already is in host memory, so there is nothing to offload")


def _offload_class() -> type[torch.optim.Optimizer]:
    """The lab's view of torchao's ``CPUOffloadOptimizer`` (imported here: torchao is optional)."""
    from torchao.optim import CPUOffloadOptimizer

    class OffloadedAdam(CPUOffloadOptimizer):
        """torchao's ``CPUOffloadOptimizer`` with what the lab reads of any optimizer: ``state`` (every per-parameter
        state, host and device: torchao keeps one optimizer per offloaded parameter and never calls
        ``Optimizer.__init__``), ``defaults`` and ``param_groups`` (the device parameters as given, so that a
        precision policy's gradient norm reads the gradients where backward left them, not host copies a side
        stream may still be writing). The offload itself is torchao's, unchanged."""

        def __init__(self, params: list[nn.Parameter], lr: float) -> None:
            self._groups = [{"params": list(params), "lr": lr}]
            super().__init__(self._groups[0]["params"], torch.optim.AdamW, minimal_size=0, lr=lr, weight_decay=0.0,
                             fused=True)

        @property
        def state(self) -> dict[Any, Any]:  # type: ignore[override]
            out: dict[Any, Any] = {}
            for opt in [*self.optim_dict.values(), *([self.d_opt] if self.d_opt is not None else [])]:
                out.update(opt.state)
            return out

        @property
        def defaults(self) -> dict[str, Any]:  # type: ignore[override]
            inner = next(iter(self.optim_dict.values()), self.d_opt)
            return dict(inner.defaults) if inner is not None else {}

        @property
        def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
            return self._groups

    return OffloadedAdam


def offload_adam() -> OptimizerFactory:
    """``(parameters, lr) -> optimizer``: Adam's state and update on the host, parameters on the device (torchao's
    ``CPUOffloadOptimizer`` around torch's fused CPU AdamW at weight decay 0), for
    :attr:`lab.technique.FitPlan.optimizer` and a timed arm's ``optimizer``."""
    cls = _offload_class()

    def make(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return cls(params, lr)

    make.__qualname__ = make.__name__ = "offload_adam"
    return make


def state_bytes_by_place(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """The optimizer state's bytes on the host (CPU) and on the device, each distinct storage once."""
    tensors = [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    return {"optimizer_state_host_bytes": tensor_bytes([t for t in tensors if t.device.type == "cpu"]),
            "optimizer_state_device_bytes": tensor_bytes([t for t in tensors if t.device.type != "cpu"])}


__all__ = ["check_offload", "offload_adam", "state_bytes_by_place"]
