"""MLP workload: a plain multi-layer perceptron on 256 features, the dense reference of the crossover map.

Why it is here: the other built-ins mix their dense layers with embeddings (ctr), recurrences (sequence),
convolutions (vision) or attention (transformer), so none of them shows what a technique does to *pure*
matrix multiplication, the part of most user models that bf16 (AMX), int8 and channel pruning speed up. This
ladder is the shape that the project's plain-PyTorch table used (256 -> w -> w -> 10, batch 128; w from 32 to
2560), so the lab's own figures can be checked against plain PyTorch at the same size
(:mod:`lab.crossover.reference`). The task: ten classes given by the arg-max of a fixed random teacher
network (tanh, 64 hidden) applied to Gaussian features, so a linear model cannot solve it and an MLP can.
Generated, so any size, offline, deterministic. Notebook: ``notebooks/07_scale.ipynb``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .base import Datasets, SizeSpec, ladder
from .metrics import classifier

N_FEATURES, N_CLASSES = 256, 10


def make_teacher_rows(n: int, *, seed: int, n_features: int = N_FEATURES,
                      n_classes: int = N_CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows ``x`` [n, n_features] float32 (standard normal) and labels ``y`` [n] int64: the arg-max of
    a random two-layer tanh teacher, whose weights come from ``seed`` too (two seeds, two tasks)."""
    if n_features < 1 or n_classes < 2:
        raise ValueError(f"need n_features >= 1 and n_classes >= 2, got {n_features}, {n_classes}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    w1 = rng.standard_normal((n_features, 64)) / np.sqrt(n_features)
    w2 = rng.standard_normal((64, n_classes))
    x = rng.standard_normal((n, n_features), dtype=np.float32)
    y = np.argmax(np.tanh(2.0 * x @ w1) @ w2, axis=1).astype(np.int64)
    return x, y


def _make_data(spec: SizeSpec, data_seed: int) -> Datasets:
    x, y = make_teacher_rows(spec.n_train + spec.n_test, seed=data_seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    n = spec.n_train
    counts = np.bincount(y[:n], minlength=N_CLASSES)
    info = {"source": "synthetic teacher-labelled Gaussian rows, lab.workloads.mlp.make_teacher_rows",
            "n_classes": N_CLASSES, "majority_class_share": float(counts.max() / max(1, n)),
            "shape": [N_FEATURES]}
    return Datasets(train=(xt[:n], yt[:n]), test=(xt[n:], yt[n:]), info=info)


class MLP(nn.Module):
    """``n_features -> width x depth (ReLU) -> n_classes``; ``forward(x [B, n_features]) -> logits``."""

    def __init__(self, n_features: int = N_FEATURES, width: int = 256, depth: int = 2,
                 n_classes: int = N_CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        d = n_features
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.ReLU()]
            d = width
        layers.append(nn.Linear(d, n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _make_model(spec: SizeSpec) -> nn.Module:
    return MLP(width=spec.model.get("width", 256), depth=spec.model.get("depth", 2))


SIZES = {
    "tiny": SizeSpec(n_train=2_048, n_test=1_024, batch_size=64, epochs=3, lr=3e-3, model={"width": 64}),
    "small": SizeSpec(n_train=32_768, n_test=4_096, batch_size=128, epochs=3, lr=1e-3, model={"width": 256}),
    "full": SizeSpec(n_train=500_000, n_test=50_000, batch_size=512, epochs=5, lr=1e-3,
                     model={"width": 1024, "depth": 3}),
}

#: Model-size ladder: the hidden width of 256 -> w -> w -> 10 (the plain-PyTorch table's widths 32, 128, 512,
#: 1024), ~10 k -> ~7.2 M parameters on the same rows. xl is speed-only: it would not converge on 2 cores.
SCALES = ladder(xs={"width": 32}, s={"width": 128}, m={"width": 512}, l={"width": 1024}, xl={"width": 2560})

WORKLOAD = classifier(
    name="mlp",
    description="MLP 256 -> w -> w -> 10 on teacher-labelled Gaussian rows: the dense reference ladder.",
    chance=1.0 / N_CLASSES,
    sizes=SIZES, make_data=_make_data, make_model=_make_model, scales=SCALES,
    reference={
        "tiny": "accuracy above the majority class within a few seconds; for tests",
        "small": "256 -> 256 -> 256 -> 10 on 32k rows",
        "full": "500k rows, 3 hidden layers of 1024; meant for a GPU, not measured on CPU",
    },
)
