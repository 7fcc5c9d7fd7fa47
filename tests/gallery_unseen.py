"""Models the doctor has never been scored or tuned on: the ``unseen`` set of ``benchmarks/doctor.py``.

Why a set apart from ``tests/gallery.py``: the doctor's compile priors and its fused-optimizer share were read
off the residuals of the gallery and Hugging Face sets (``lab.doctor.predict_compile``), so for those rules a
second run on the same models is a re-test, not a held-out test. These models were added after those rules
were fixed and nothing in ``lab.doctor`` may be fitted on them; when a rule changes because of them, they
stop being held out and the next rule needs new ones. Each exercises structure the other sets lack:

- ``unseen_lstmcell``: an ``nn.LSTMCell`` unrolled in a Python loop (16 steps): a recurrent model whose ops
  run one time step at a time, unlike ``nn.GRU``'s single fused ``aten::gru`` call.
- ``unseen_conv1d``: a 1-D convolutional classifier (``Conv1d`` + ``BatchNorm1d`` + ``SiLU``) on synthetic
  waveforms: which of 4 frequencies a noisy signal carries.
- ``unseen_moe``: a dense-dispatch mixture of 4 expert MLPs with a softmax gate (every expert runs, the gate
  weights them): many small matmuls, a softmax and a weighted sum per sample.
- ``unseen_widedeep``: wide & deep over ``nn.EmbeddingBag`` (sum-pooled multi-hot fields) plus a dense MLP.

Each ``tiny`` run trains in a few seconds on a 2-core CPU; data are generated from a seed, never downloaded.
"""

from __future__ import annotations

import math

import torch
from gallery import _split, _workload
from torch import nn

from lab.workloads import Datasets, SizeSpec, Workload, register_workload

# -------------------------------------------------------------------------------------- LSTMCell loop

STEPS, FEATURES = 16, 8


def _running_sign_data(spec: SizeSpec, seed: int) -> Datasets:
    g = torch.Generator().manual_seed(4000 + seed)
    n = spec.n_train + spec.n_test
    x = torch.randn(n, STEPS, FEATURES, generator=g)
    y = (x[:, :, 0].cumsum(1)[:, -1] > 0).long() + 2 * (x[:, STEPS // 2:, 1].sum(1) > 0).long()
    return _split(x, y, spec, seed, {"source": "signs of two running sums (4 classes)"})


class LSTMCellLoop(nn.Module):
    """One ``nn.LSTMCell`` applied step by step in Python, then a linear head on the last hidden state."""

    def __init__(self, hidden: int = 48) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(FEATURES, hidden)
        self.head = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.cell.hidden_size)
        c = torch.zeros_like(h)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.head(h)


# ---------------------------------------------------------------------------------------- 1-D conv

WAVE_LEN, N_FREQ = 128, 4


def _wave_data(spec: SizeSpec, seed: int) -> Datasets:
    g = torch.Generator().manual_seed(5000 + seed)
    n = spec.n_train + spec.n_test
    y = torch.randint(0, N_FREQ, (n,), generator=g)
    t = torch.arange(WAVE_LEN, dtype=torch.float32)
    phase = torch.rand(n, 1, generator=g) * 2 * math.pi
    freq = (2 + 3 * y.float())[:, None]  # 2, 5, 8, 11 cycles per window
    x = torch.sin(2 * math.pi * freq * t / WAVE_LEN + phase) + 0.8 * torch.randn(n, WAVE_LEN, generator=g)
    return _split(x[:, None, :], y, spec, seed, {"source": "noisy sinusoids, 4 frequencies"})


class Conv1dNet(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 1
        for c_out in (width, width, 2 * width):
            layers += [nn.Conv1d(c_in, c_out, 5, padding=2, bias=False), nn.BatchNorm1d(c_out), nn.SiLU(),
                       nn.MaxPool1d(2)]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, N_FREQ)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(-1))


# ------------------------------------------------------------------------------ dense mixture of experts

MOE_IN, N_EXPERTS = 16, 4


def _regions_data(spec: SizeSpec, seed: int) -> Datasets:
    g = torch.Generator().manual_seed(6000 + seed)
    n = spec.n_train + spec.n_test
    x = torch.randn(n, MOE_IN, generator=g)
    region = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()  # each quadrant has its own rule
    w = torch.randn(N_EXPERTS, MOE_IN, generator=g)
    y = ((x * w[region]).sum(1) > 0).long() + 2 * (region % 2)
    return _split(x, y, spec, seed, {"source": "4 regions, each its own linear rule (4 classes)"})


class DenseMoE(nn.Module):
    """A softmax gate over ``N_EXPERTS`` expert MLPs; every expert runs on every sample (no routing, so the
    shapes are static) and the gate weights their outputs."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.gate = nn.Linear(MOE_IN, N_EXPERTS)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(MOE_IN, hidden), nn.GELU(), nn.Linear(hidden, 4))
                                     for _ in range(N_EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.gate(x), dim=-1)
        outs = torch.stack([e(x) for e in self.experts], dim=1)  # (batch, experts, classes)
        return (weights[:, :, None] * outs).sum(1)


# ------------------------------------------------------------------------------------ wide & deep

FIELDS, FIELD_VOCAB, HOTS, DENSE = 4, 50, 3, 6


def _multi_hot_data(spec: SizeSpec, seed: int) -> Datasets:
    g = torch.Generator().manual_seed(7000 + seed)
    n = spec.n_train + spec.n_test
    ids = torch.randint(0, FIELD_VOCAB, (n, FIELDS, HOTS), generator=g)
    dense = torch.randn(n, DENSE, generator=g)
    score = (ids < FIELD_VOCAB // 5).float().sum((1, 2)) - 2.4 + dense[:, 0]
    y = (score > 0).long()
    x = torch.cat([ids.reshape(n, -1).float(), dense], 1)  # one tensor: ids as exact small floats
    return _split(x, y, spec, seed, {"source": "multi-hot fields + dense features (2 classes)"})


class WideDeep(nn.Module):
    """Per field an ``nn.EmbeddingBag`` (sum over its hot ids) -> concat with the dense features -> MLP,
    plus a wide linear path over the dense features."""

    def __init__(self, d: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(FIELD_VOCAB, d, mode="sum") for _ in range(FIELDS))
        self.deep = nn.Sequential(nn.Linear(FIELDS * d + DENSE, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        self.wide = nn.Linear(DENSE, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x[:, :FIELDS * HOTS].long().reshape(-1, FIELDS, HOTS)
        dense = x[:, FIELDS * HOTS:]
        pooled = [bag(ids[:, f]) for f, bag in enumerate(self.bags)]
        return self.deep(torch.cat([*pooled, dense], 1)) + self.wide(dense)


# ------------------------------------------------------------------------------------------ registry

UNSEEN: dict[str, Workload] = {w.name: w for w in (
    _workload("unseen_lstmcell", "nn.LSTMCell unrolled in a Python loop",
              SizeSpec(n_train=1024, n_test=256, batch_size=64, epochs=3, lr=1e-2), _running_sign_data,
              lambda spec: LSTMCellLoop()),
    _workload("unseen_conv1d", "1-D CNN on noisy sinusoids",
              SizeSpec(n_train=1024, n_test=256, batch_size=64, epochs=3, lr=3e-3), _wave_data,
              lambda spec: Conv1dNet()),
    _workload("unseen_moe", "dense mixture of 4 expert MLPs with a softmax gate",
              SizeSpec(n_train=2048, n_test=512, batch_size=64, epochs=3, lr=3e-3), _regions_data,
              lambda spec: DenseMoE()),
    _workload("unseen_widedeep", "wide & deep over nn.EmbeddingBag fields",
              SizeSpec(n_train=2048, n_test=512, batch_size=128, epochs=3, lr=3e-3), _multi_hot_data,
              lambda spec: WideDeep()),
)}


def register_unseen() -> dict[str, Workload]:
    """Register (or re-register) every unseen workload; returns them by name."""
    for wl in UNSEEN.values():
        register_workload(wl, overwrite=True)
    return UNSEEN
