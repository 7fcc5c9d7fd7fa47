"""Shared fixtures: a tiny user-defined workload (registered through the public door) and a private
results store per test, so no test touches the default database."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from lab.workloads import Datasets, SizeSpec, Workload, register_workload


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


@pytest.fixture(scope="session")
def toy_workload() -> Workload:
    return register_workload(TOY, overwrite=True)


@pytest.fixture(autouse=True)
def private_store(tmp_path, monkeypatch):
    """Every test gets its own results database via the documented environment variable."""
    path = tmp_path / "results.sqlite"
    monkeypatch.setenv("LAB_RESULTS_DB", str(path))
    return path


@pytest.fixture(autouse=True)
def _restore_main_module():
    """Streamlit's AppTest runs a page as ``__main__`` and leaves it there; a data-parallel run spawned by a
    later test would then re-run that temporary script in every rank (multiprocessing's spawn re-imports
    ``__main__`` from its path). Each test gets the process's own ``__main__`` back."""
    main = sys.modules.get("__main__")
    attrs = {k: getattr(main, k) for k in ("__file__", "__spec__") if hasattr(main, k)}
    yield
    if main is not None:
        sys.modules["__main__"] = main
        for k, v in attrs.items():
            setattr(main, k, v)
