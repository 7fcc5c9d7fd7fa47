"""ResNets written out by hand (torchvision's wheels do not match the pinned torch).

One ``ResNet`` class covers the CIFAR-style small nets used at CPU sizes (BasicBlocks, a 3x3 stem, no
max-pool: 28x28 digits are too small to throw away resolution in the stem) and the standard ResNet-50
(Bottleneck [3, 4, 6, 3], widths 64-512, expansion 4) used at ``full``, adapted to 1-channel small images
the same way. Plain ``nn.Conv2d`` / ``nn.BatchNorm2d`` / ``nn.Linear`` only, so the pruning and quantization
modules see the layer types they know. Notebook: ``notebooks/03_pruning.ipynb``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    # No conv bias: the BatchNorm right after it has its own shift.
    conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)
    return conv, nn.BatchNorm2d(c_out)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual add (ResNet-18/34 and the small CIFAR nets)."""

    expansion = 1

    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.conv1, self.bn1 = _conv_bn(c_in, width, 3, stride)
        self.conv2, self.bn2 = _conv_bn(width, c_out, 3)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(c_in, c_out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride, as in torchvision's "ResNet v1.5"), 1x1 expand x4."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.conv1, self.bn1 = _conv_bn(c_in, width, 1)
        self.conv2, self.bn2 = _conv_bn(width, width, 3, stride)
        self.conv3, self.bn3 = _conv_bn(width, c_out, 1)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(c_in, c_out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    conv, bn = _conv_bn(c_in, c_out, 1, stride)
    return nn.Sequential(conv, bn)


class ResNet(nn.Module):
    """Stem, one stage per entry of ``blocks`` (the first at stride 1, the others halve the resolution),
    global average pool, linear classifier. ``forward(x [B, C, H, W]) -> logits [B, num_classes]``; works
    for any H, W >= 8 because of the adaptive pool."""

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        blocks: Sequence[int],
        widths: Sequence[int],
        *,
        in_channels: int = 1,
        num_classes: int = 10,
        stem_width: int | None = None,
        stem_stride: int = 1,
        zero_init_residual: bool = True,
    ) -> None:
        super().__init__()
        if len(blocks) != len(widths):
            raise ValueError(f"blocks {tuple(blocks)} and widths {tuple(widths)} must have the same length")
        stem_width = stem_width or widths[0]
        # A stride-2 stem quarters the compute of every later layer while still seeing full-resolution pixels.
        conv, bn = _conv_bn(in_channels, stem_width, 3, stem_stride)
        self.stem = nn.Sequential(conv, bn, nn.ReLU(inplace=True))
        stages: list[nn.Module] = []
        c_in = stem_width
        for i, (n, width) in enumerate(zip(blocks, widths, strict=True)):
            layers = []
            for j in range(n):
                layers.append(block(c_in, width, stride=2 if (i > 0 and j == 0) else 1))
                c_in = width * block.expansion
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual:
            # Each block starts as the identity (Goyal et al. 2017): trains faster and more stably, which
            # matters when the lab's small runs are only a few epochs long.
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(m.last_bn().weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def small_resnet(widths: Sequence[int] = (16, 32, 64), blocks: Sequence[int] = (1, 1, 1), *,
                 in_channels: int = 1, num_classes: int = 10, stem_stride: int = 1,
                 zero_init_residual: bool = True) -> ResNet:
    """CIFAR-style ResNet with BasicBlocks (ResNet-8 at the defaults): the CPU-sized member of the family."""
    return ResNet(BasicBlock, blocks, widths, in_channels=in_channels, num_classes=num_classes,
                  stem_stride=stem_stride, zero_init_residual=zero_init_residual)


def resnet18(*, in_channels: int = 1, num_classes: int = 10) -> ResNet:
    """Standard ResNet-18 body (BasicBlock [2, 2, 2, 2], widths 64-512) with the small-image stem."""
    return ResNet(BasicBlock, (2, 2, 2, 2), (64, 128, 256, 512), in_channels=in_channels,
                  num_classes=num_classes)


def resnet50(*, in_channels: int = 1, num_classes: int = 10) -> ResNet:
    """Standard ResNet-50 body (Bottleneck [3, 4, 6, 3], widths 64-512, 2048 features) with the small-image
    stem: the seed's model, ~23.5 M parameters at 10 classes."""
    return ResNet(Bottleneck, (3, 4, 6, 3), (64, 128, 256, 512), in_channels=in_channels,
                  num_classes=num_classes, stem_width=64)


ARCHS = {"small": small_resnet, "resnet18": resnet18, "resnet50": resnet50}


def build_resnet(arch: str = "small", **kwargs: object) -> ResNet:
    """Build ``arch`` (one of ``ARCHS``) with its keyword arguments (from the ``SizeSpec.model`` dict)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown ResNet arch {arch!r}; available: {sorted(ARCHS)}")
    return ARCHS[arch](**kwargs)  # type: ignore[operator]
