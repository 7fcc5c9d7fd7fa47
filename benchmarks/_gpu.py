"""What the GPU parts of the family benchmarks share, none of it a timer (every timing is ``lab.measure``'s):
the sizes and time budgets of each setting, a part's context (device, sizes, deadline), the ``gpu.json`` report
rewritten after every part, the device handling (why there is no CUDA, freeing memory between cases) and the
probe that drops an arm too slow on this machine to time within a part's budget.

Each family file (``benchmarks/data_loading.py``, ``precision.py``, ``pruning.py``, ``quantization.py``,
``distributed.py``, ``memory.py``) holds its own GPU part as ``gpu_part(ctx, figs)``; ``benchmarks/gpu.py`` drives
them. This module imports only torch and ``lab`` (the H200 box has torch, torchao, numpy, pandas and pyarrow,
nothing else).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common  # noqa: F401 - first: puts the repository root on sys.path, so ``lab`` imports without installing
import torch
from torch import nn

from lab.measure import block_ms, error_text
from lab.result import to_jsonable
from lab.workloads.resnet import Bottleneck, ResNet, build_resnet

# ------------------------------------------------------------------------------------------------ settings
# Kept in one place, apart from the parts, so one screen says how big and how long every part runs per setting.


@dataclass(frozen=True)
class VisionCase:
    """One ResNet training shape: ``make()`` builds the model, inputs are synthetic [batch, C, image, image]."""

    label: str
    make: Callable[[], nn.Module]
    channels: int
    image: int
    batch: int
    classes: int
    goal_bf16_vs_fp32: float | None = None


def _resnet50_imagenet_like() -> nn.Module:
    # The lab's ResNet-50 with a stride-2 stem: at 112x112 input its body sees 56x56, as torchvision's ResNet-50
    # does at 224x224 after conv+maxpool, so the FLOPs match the published ImageNet tables (~4 GFLOPs forward).
    return ResNet(Bottleneck, (3, 4, 6, 3), (64, 128, 256, 512), in_channels=3, num_classes=1000, stem_width=64,
                  stem_stride=2)


def _resnet50_workload() -> nn.Module:
    return build_resnet("resnet50", in_channels=1, num_classes=10)  # the vision workload's model at size full


def _resnet_tiny() -> nn.Module:
    return build_resnet("small", widths=(4, 8), blocks=(1, 1), in_channels=3, num_classes=10)


@dataclass(frozen=True)
class Settings:
    """Sizes and budgets of one setting (full, quick, or tiny for the CPU self-test)."""

    name: str
    repeats: int
    total_budget_s: float
    budgets_s: dict[str, float]
    vision_cases: tuple[VisionCase, ...]
    vision_iters: int
    vision_warmup: int
    ctr_size: str
    ctr_seeds: int
    ctr_block: int
    ctr_max_steps: int | None
    data_batches: tuple[int, ...]
    data_iters: int
    prune_shapes: tuple[tuple[int, int, int], ...]  # (tokens, in_features, out_features)
    prune_dtypes: tuple[str, ...]
    prune_iters: int
    quant_width: int
    quant_hidden: int
    quant_layers: int
    quant_iters: int
    quant_compile: bool
    ddp_cases: tuple[str, ...]  # "vision" (ddp_vision's ResNet) and / or "ctr" (the ctr model at ctr_size)
    ddp_vision: VisionCase
    ddp_iters: int
    memory_cases: tuple[tuple[str, str, int], ...]  # (ladder, rung, batch): the memory part's training steps, in order
    memory_iters: int
    warmup: int = 3
    min_repeats: int = 3


FULL = Settings(
    name="full", repeats=5, total_budget_s=390.0,
    budgets_s={"precision": 100.0, "data": 40.0, "pruning": 30.0, "distributed": 40.0, "memory": 60.0,
               "quantization": 120.0},
    vision_cases=(VisionCase("resnet50-112px-b128", _resnet50_imagenet_like, 3, 112, 128, 1000, 2.0),
                  VisionCase("resnet50-vision-full-28px-b128", _resnet50_workload, 1, 28, 128, 10)),
    vision_iters=10, vision_warmup=5, ctr_size="small", ctr_seeds=3, ctr_block=20, ctr_max_steps=None,
    data_batches=(4096, 32768), data_iters=20,
    prune_shapes=((4096, 4096, 4096), (8192, 8192, 8192)), prune_dtypes=("fp16", "bf16"), prune_iters=20,
    quant_width=4096, quant_hidden=14336, quant_layers=8, quant_iters=50, quant_compile=True,
    ddp_cases=("vision", "ctr"), ddp_iters=20,
    ddp_vision=VisionCase("resnet50-vision-full-28px-b128", _resnet50_workload, 1, 28, 128, 10),
    memory_cases=(("transformer", "xl", 256), ("vision", "xl", 128)), memory_iters=10)

QUICK = dataclasses.replace(
    FULL, name="quick", repeats=3, total_budget_s=150.0,
    budgets_s={"precision": 40.0, "data": 15.0, "pruning": 10.0, "distributed": 15.0, "memory": 30.0,
               "quantization": 40.0},
    vision_cases=(VisionCase("resnet50-vision-full-28px-b128", _resnet50_workload, 1, 28, 128, 10),),
    vision_iters=5, ctr_size="tiny", ctr_block=8, data_batches=(4096,), data_iters=10,
    prune_shapes=((4096, 4096, 4096),), prune_dtypes=("fp16",), prune_iters=10,
    quant_layers=4, quant_iters=20, quant_compile=False, ddp_cases=("ctr",), ddp_iters=10,
    memory_cases=(("transformer", "xl", 256),), memory_iters=5)

TINY = dataclasses.replace(  # CPU self-test: every code path, seconds of CPU time, timings meaningless
    FULL, name="tiny", repeats=3, total_budget_s=120.0,
    budgets_s={"precision": 30.0, "data": 10.0, "pruning": 10.0, "distributed": 20.0, "memory": 10.0,
               "quantization": 20.0},
    vision_cases=(VisionCase("resnet-tiny-16px-b4", _resnet_tiny, 3, 16, 4, 10),),
    vision_iters=1, vision_warmup=1, ctr_size="tiny", ctr_seeds=3, ctr_block=2, ctr_max_steps=6,
    data_batches=(256,), data_iters=2, prune_shapes=((64, 128, 128),), prune_dtypes=("bf16",), prune_iters=2,
    quant_width=128, quant_hidden=256, quant_layers=2, quant_iters=2, quant_compile=False,
    ddp_cases=("vision", "ctr"), ddp_iters=1, warmup=1,
    memory_cases=(("transformer", "xs", 8), ("vision", "xs", 4)), memory_iters=1,
    ddp_vision=VisionCase("resnet-tiny-16px-b4", _resnet_tiny, 3, 16, 4, 10))


# ------------------------------------------------------------------------------------------------ a part's context

@dataclass
class PartContext:
    """What a part gets: the device, the sizes, its deadline, a logger and a checkpoint (write the JSON).

    ``deadline`` is a ``time.monotonic()`` value, as ``lab.measure.interleaved_ms`` takes it."""

    device: torch.device
    sz: Settings
    deadline: float
    log: Callable[[str], None]
    checkpoint: Callable[[], None]

    def left_s(self) -> float:
        return self.deadline - time.monotonic()


GpuPart = Callable[[PartContext, list[dict[str, Any]]], None]
"""A family's GPU part: appends its figures to the list, calling ``ctx.checkpoint()`` after each sub-case."""


# ------------------------------------------------------------------------------------------------ report

@dataclass
class Report:
    """The ``gpu.json`` envelope (the one ``benchmarks/_common.py`` writes), rewritten atomically whenever
    asked, so a run killed by its time limit still leaves every figure measured so far."""

    path: Path | None
    quick: bool
    env: dict[str, Any]
    setting: str
    figures: list[dict[str, Any]] = field(default_factory=list)
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def envelope(self) -> dict[str, Any]:
        return {"benchmark": "gpu", "quick": self.quick, "env": self.env, "figures": self.figures,
                "parts": self.parts, "setting": self.setting}

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(to_jsonable(self.envelope()), indent=2))
        os.replace(tmp, self.path)


# ------------------------------------------------------------------------------------------------ device

def free_memory() -> None:
    """Collect garbage and return cached CUDA memory between cases, so one case's tensors do not crowd the next."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def no_cuda_reason() -> str | None:
    """Why the GPU parts cannot run here, or None when a CUDA device is usable."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"no CUDA device on this machine (torch {torch.__version__} is a CPU-only build)"
    return f"no CUDA device on this machine (torch {torch.__version__}, CUDA {torch.version.cuda}: none visible)"


def max_errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max abs error, that error relative to max |ref|), in fp32."""
    diff = float((out.float() - ref.float()).abs().max())
    scale = float(ref.float().abs().max()) or 1.0
    return diff, diff / scale


def drop_slow_arms(arms: dict[str, Callable[[], Any]], *, reference: str, sync: torch.device,
                   errors: dict[str, str], max_ratio: float = 8.0, min_extra_ms: float = 100.0) -> None:
    """Call every arm once (``reference`` first), timed with ``lab.measure.block_ms``; drop from ``arms`` each arm
    that raises, or that took more than ``max_ratio`` x the reference's call *and* ``min_extra_ms`` more, with its
    reason in ``errors``.

    Why: an arm with no fast kernel here (fp16 / bf16 convolutions on a CPU without native support, or under an
    ISA cap such as ``ONEDNN_MAX_CPU_ISA=AVX2``) can take seconds per step, and ``interleaved_ms`` checks the
    deadline only between rounds, after ``min_repeats`` of them: such an arm would be timed for minutes and blow
    the part's budget. One probe call, which doubles as the first warm-up call, is enough to see it. Both
    thresholds must be passed: a first call also pays one-time setup, which can be several times the steady step
    on tiny sizes, but that is milliseconds, not a tenth of a second."""
    order = [reference, *(name for name in arms if name != reference)] if reference in arms else list(arms)
    ref_ms: float | None = None
    for name in order:
        try:
            ms = block_ms(arms[name], 1, sync)
        except Exception as exc:  # noqa: BLE001 - as interleaved_ms does: a failing arm is an entry, not the end
            errors[name] = error_text(exc)
            del arms[name]
            continue
        if name == reference:
            ref_ms = ms
        elif ref_ms is not None and ms > max_ratio * ref_ms and ms - ref_ms > min_extra_ms:
            errors[name] = (f"too slow here to time within the part's budget: {ms:.0f} ms on one probe call vs "
                            f"{ref_ms:.1f} ms for {reference} (> {max_ratio:g}x and > {min_extra_ms:g} ms more; "
                            f"no fast kernel for it on this machine?)")
            del arms[name]
