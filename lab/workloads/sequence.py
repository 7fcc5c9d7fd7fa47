"""Sequence workload (seed 002): an LSTM classifies which planted events occur, and in which order.

The data are the seed's example shape (10 time steps x 100 features) with a rule that *needs* the time
order: each sequence carries two events at random steps t1 < t2, each event pattern A or B, and the class is
the ordered pair (A then B, B then A, A then A, B then B). Classes 0 and 1 have the same bag of steps, so a
model that ignores order tops out at 75 % while the LSTM can reach ~100 %; chance is 25 %. A distractor
pattern at a third random step and per-event amplitude jitter keep it from being trivial. Generated, so any
size, offline, deterministic. Notebooks: ``notebooks/03_pruning.ipynb``, ``notebooks/04_quantization.ipynb``
(dynamic int8 of ``nn.LSTM`` is one of the silent no-ops the lab checks for).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .base import Datasets, SizeSpec, ladder
from .metrics import classifier

# Ordered (first, second) event per class: 0 = pattern A, 1 = pattern B.
CLASS_ORDER: tuple[tuple[int, int], ...] = ((0, 1), (1, 0), (0, 0), (1, 1))


def make_sequences(
    n: int,
    *,
    seed: int,
    n_steps: int = 10,
    n_features: int = 100,
    amplitude: float = 0.45,
    noise: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` sequences ``x`` [n, n_steps, n_features] float32 and labels ``y`` [n] int64 (balanced).

    The patterns come from ``seed`` too, so two seeds are two different tasks of the same difficulty.
    ``amplitude`` is the per-feature size of an event relative to unit noise: at 0.45 an event projects
    to ~4.5 noise standard deviations along its pattern: each event is easy to see, so what is learned is
    the order, which a model has to carry across the noisy steps in between.
    """
    if n_steps < 3:
        raise ValueError(f"n_steps must be >= 3 (two events and a distractor), got {n_steps}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 2]))
    patterns = rng.standard_normal((3, n_features))
    patterns /= np.linalg.norm(patterns, axis=1, keepdims=True) / np.sqrt(n_features)  # unit RMS per feature
    patterns = patterns.astype(np.float32)
    y = rng.permutation(np.arange(n) % len(CLASS_ORDER)).astype(np.int64)
    x = rng.standard_normal((n, n_steps, n_features), dtype=np.float32)  # float32 draws: half the time
    x *= np.float32(noise)
    # Three distinct steps per row: two ordered events and one distractor.
    steps = np.argsort(rng.random((n, n_steps)), axis=1)[:, :3]
    t1, t2 = np.minimum(steps[:, 0], steps[:, 1]), np.maximum(steps[:, 0], steps[:, 1])
    order = np.asarray(CLASS_ORDER)[y]
    gain = (amplitude * rng.uniform(0.7, 1.3, size=(n, 3))).astype(np.float32)
    rows = np.arange(n)
    x[rows, t1] += gain[:, :1] * patterns[order[:, 0]]
    x[rows, t2] += gain[:, 1:2] * patterns[order[:, 1]]
    x[rows, steps[:, 2]] += gain[:, 2:] * patterns[2]
    return x, y


def _make_data(spec: SizeSpec, data_seed: int) -> Datasets:
    d = spec.data
    x, y = make_sequences(spec.n_train + spec.n_test, seed=data_seed, n_steps=d.get("n_steps", 10),
                          n_features=d.get("n_features", 100), amplitude=d.get("amplitude", 0.45))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    n = spec.n_train
    info = {
        "source": "synthetic ordered-events sequences, lab.workloads.sequence.make_sequences",
        "n_classes": len(CLASS_ORDER),
        "chance_accuracy": 1.0 / len(CLASS_ORDER),
        "order_blind_ceiling": 0.75,  # classes 0 and 1 differ only in order
        "shape": list(x.shape[1:]),
    }
    return Datasets(train=(xt[:n], yt[:n]), test=(xt[n:], yt[n:]), info=info)


class LSTMClassifier(nn.Module):
    """``nn.LSTM`` (batch_first) + a linear head on the last time step's hidden state: the seed's model.
    ``forward(x [B, T, F]) -> logits [B, n_classes]``."""

    def __init__(self, n_features: int = 100, hidden: int = 64, n_classes: int = 4,
                 num_layers: int = 1) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _make_model(spec: SizeSpec) -> nn.Module:
    return LSTMClassifier(n_features=spec.data.get("n_features", 100), hidden=spec.model.get("hidden", 64),
                          n_classes=len(CLASS_ORDER), num_layers=spec.model.get("num_layers", 1))


SIZES = {
    "tiny": SizeSpec(n_train=2_048, n_test=1_024, batch_size=64, epochs=3, lr=5e-3, model={"hidden": 64}),
    # More rows rather than more epochs: by the third pass over 24k rows the test loss was already rising.
    "small": SizeSpec(n_train=65_536, n_test=8_192, batch_size=128, epochs=3, lr=3e-3, model={"hidden": 64}),
    "full": SizeSpec(n_train=500_000, n_test=50_000, batch_size=512, epochs=10, lr=1e-3,
                     model={"hidden": 256, "num_layers": 2}),
}

#: Model-size ladder: LSTM hidden size, then a second layer; ~3.6 k -> ~7.4 M parameters on the
#: same 10 x 100 sequences.
SCALES = ladder(xs={"hidden": 8, "num_layers": 1}, s={"hidden": 32, "num_layers": 1},
                m={"hidden": 128, "num_layers": 1}, l={"hidden": 384, "num_layers": 1},
                xl={"hidden": 768, "num_layers": 2})

WORKLOAD = classifier(
    name="sequence",
    description="LSTM (seed 002) on 10 x 100 sequences whose class is the order of two planted events.",
    chance=1.0 / len(CLASS_ORDER),
    sizes=SIZES, make_data=_make_data, make_model=_make_model, scales=SCALES,
    # Measured with the plain Adam loop, torch 2.13 CPU, 2 threads, data seeds 0-2.
    reference={
        "tiny": "accuracy 0.25 -> ~0.84 in ~0.5 s; for tests",
        "small": "accuracy ~0.955 (chance 0.25, order-blind ceiling 0.75); ~8 s training + ~2 s generating "
                 "on 2 CPU cores",
        "full": "500k sequences, 2-layer LSTM hidden 256; meant for a GPU, not measured on CPU",
    },
)
