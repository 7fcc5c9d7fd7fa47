"""The test-only toy workload (8 features, a linear rule), in a module of its own name: spawned DDP ranks and
AppTest pages import it as ``toy_workload``. Importing it as ``conftest`` was order-dependent: the repository
root has a conftest.py too, and whichever directory came first on a rank's ``sys.path`` won."""

from __future__ import annotations

import torch
from torch import nn

from lab.workloads import Datasets, SizeSpec, Workload


def _toy_data(spec: SizeSpec, seed: int) -> Datasets:
    g = torch.Generator().manual_seed(seed)
    n = spec.n_train + spec.n_test
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, generator=g)
    y = (x @ w > 0).long()
    return Datasets(train=(x[:spec.n_train], y[:spec.n_train]), test=(x[spec.n_train:], y[spec.n_train:]),
                    info={"source": "toy linear rule"})


def _toy_model(spec: SizeSpec) -> nn.Module:
    return nn.Sequential(nn.Linear(8, spec.model.get("hidden", 16)), nn.ReLU(),
                         nn.Linear(spec.model.get("hidden", 16), 2))


def _accuracy(out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    return {"accuracy": (out.argmax(1) == y).float().mean().item()}


TOY_SPEC = SizeSpec(n_train=512, n_test=256, batch_size=32, epochs=2, lr=0.01)
TOY = Workload(name="toy", description="8 features, a linear rule; for tests",
               sizes={"tiny": TOY_SPEC, "small": TOY_SPEC, "full": TOY_SPEC},
               make_data=_toy_data, make_model=_toy_model, loss=nn.functional.cross_entropy,
               evaluate=_accuracy, metric_name="accuracy", reference={"tiny": "accuracy > 0.9"})
