"""Per-sample decoding and augmentation for the file-backed source: the CPU work a real loader does.

Why hand-written: ``torchvision.transforms.v2`` is the usual choice, but torchvision does not load with the
torch build this lab pins, so the three transforms a digit/CIFAR-style pipeline uses are written here in
numpy (per sample, as a loader worker would run them): zero-pad by ``pad`` then a random ``H x W`` crop
(``RandomCrop(size, padding=pad)``), a horizontal flip with probability ``flip_p`` (``RandomHorizontalFlip``),
and normalisation by the training split's mean and std (``Normalize``). ``tests/data/test_data_files.py`` checks
them against direct tensor slicing. Flip is off by default: a mirrored digit is often another glyph.

The random choices are drawn per (seed, epoch) for every row at once, not from a process-global generator,
so the same sample gets the same crop in any worker, any loader, and after a resume.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image


def decode_png(data: bytes) -> np.ndarray:
    """PNG bytes -> uint8 array [H, W] (greyscale) or [H, W, 3], decoded by Pillow."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("L" if im.mode in ("L", "1", "P") else "RGB"))


@dataclass(frozen=True)
class Augment:
    """Random crop with zero padding, horizontal flip, normalise. ``pad=0, flip_p=0`` is decode + normalise."""

    pad: int = 2
    flip_p: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.pad, bool) or not isinstance(self.pad, int) or self.pad < 0:
            raise ValueError(f"augment.pad={self.pad!r} is invalid: must be an integer >= 0")
        if not 0.0 <= self.flip_p <= 1.0:
            raise ValueError(f"augment.flip_p={self.flip_p!r} is invalid: must be in [0, 1]")

    def draws(self, n: int, *, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Crop offsets [n, 2] in 0..2*pad and flip flags [n] for every row of an epoch."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 7_919)
        offsets = torch.randint(0, 2 * self.pad + 1, (n, 2), generator=g).numpy()
        flips = (torch.rand(n, generator=g) < self.flip_p).numpy()
        return offsets, flips

    def apply(self, img: np.ndarray, offset: np.ndarray, flip: bool) -> np.ndarray:
        """One uint8 image [H, W(, C)] -> the augmented uint8 image of the same size."""
        h, w = img.shape[:2]
        if self.pad:
            widths = ((self.pad, self.pad), (self.pad, self.pad)) + ((0, 0),) * (img.ndim - 2)
            img = np.pad(img, widths)
            img = img[offset[0]:offset[0] + h, offset[1]:offset[1] + w]
        if flip:
            img = img[:, ::-1]
        return img


def to_model_input(images: list[np.ndarray], mean: float, std: float) -> torch.Tensor:
    """uint8 images -> the normalised float batch [N, C, H, W] the vision model takes (same arithmetic as
    :func:`lab.workloads.vision` applies to its in-memory split: /255, then (x - mean) / std)."""
    x = torch.from_numpy(np.stack(images))
    x = x.unsqueeze(1) if x.dim() == 3 else x.permute(0, 3, 1, 2)
    return (x.float().div_(255.0) - mean) / std
