"""The test-only toy workload (8 features, a linear rule), in a module of its own name: spawned DDP ranks and
AppTest pages import it as ``toy_workload``. Importing it as ``conftest`` was order-dependent: the repository
root has a conftest.py too, and whichever directory came first on a rank's ``sys.path`` won."""

from __future__ import annotations

import torch
from torch import nn

from lab.workloads import Datasets, SizeSpec, Workload


class MapStyleDataset(torch.utils.data.Dataset):
    """A user's map-style dataset (``__len__`` and ``__getitem__``, one ``(features, label)`` item at a time):
    ``n`` rows of ``features`` normal features and a 0/1 label, drawn from ``seed``."""

    def __init__(self, n: int, features: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, features, generator=g), torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


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
