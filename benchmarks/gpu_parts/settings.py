"""Sizes and time budgets of the GPU benchmark: the full run, ``--quick``, and the tiny CPU self-test.

Kept apart from the parts so one place says how big and how long every part runs in each setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from lab.workloads.resnet import Bottleneck, ResNet, build_resnet


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
    warmup: int = 3
    min_repeats: int = 3


FULL = Settings(
    name="full", repeats=5, total_budget_s=330.0,
    budgets_s={"precision": 100.0, "data": 40.0, "pruning": 30.0, "distributed": 40.0, "quantization": 120.0},
    vision_cases=(VisionCase("resnet50-112px-b128", _resnet50_imagenet_like, 3, 112, 128, 1000, 2.0),
                  VisionCase("resnet50-vision-full-28px-b128", _resnet50_workload, 1, 28, 128, 10)),
    vision_iters=10, vision_warmup=5, ctr_size="small", ctr_seeds=3, ctr_block=20, ctr_max_steps=None,
    data_batches=(4096, 32768), data_iters=20,
    prune_shapes=((4096, 4096, 4096), (8192, 8192, 8192)), prune_dtypes=("fp16", "bf16"), prune_iters=20,
    quant_width=4096, quant_hidden=14336, quant_layers=8, quant_iters=50, quant_compile=True,
    ddp_cases=("vision", "ctr"), ddp_iters=20,
    ddp_vision=VisionCase("resnet50-vision-full-28px-b128", _resnet50_workload, 1, 28, 128, 10))

QUICK = dataclasses.replace(
    FULL, name="quick", repeats=3, total_budget_s=120.0,
    budgets_s={"precision": 40.0, "data": 15.0, "pruning": 10.0, "distributed": 15.0, "quantization": 40.0},
    vision_cases=(VisionCase("resnet50-vision-full-28px-b128", _resnet50_workload, 1, 28, 128, 10),),
    vision_iters=5, ctr_size="tiny", ctr_block=8, data_batches=(4096,), data_iters=10,
    prune_shapes=((4096, 4096, 4096),), prune_dtypes=("fp16",), prune_iters=10,
    quant_layers=4, quant_iters=20, quant_compile=False, ddp_cases=("ctr",), ddp_iters=10)

TINY = dataclasses.replace(  # CPU self-test: every code path, seconds of CPU time, timings meaningless
    FULL, name="tiny", repeats=3, total_budget_s=120.0,
    budgets_s={"precision": 30.0, "data": 10.0, "pruning": 10.0, "distributed": 20.0, "quantization": 20.0},
    vision_cases=(VisionCase("resnet-tiny-16px-b4", _resnet_tiny, 3, 16, 4, 10),),
    vision_iters=1, vision_warmup=1, ctr_size="tiny", ctr_seeds=3, ctr_block=2, ctr_max_steps=6,
    data_batches=(256,), data_iters=2, prune_shapes=((64, 128, 128),), prune_dtypes=("bf16",), prune_iters=2,
    quant_width=128, quant_hidden=256, quant_layers=2, quant_iters=2, quant_compile=False,
    ddp_cases=("vision", "ctr"), ddp_iters=1, warmup=1,
    ddp_vision=VisionCase("resnet-tiny-16px-b4", _resnet_tiny, 3, 16, 4, 10))
