"""Shared fixtures: a tiny user-defined workload (registered through the public door) and a private
results store per test, so no test touches the default database."""

from __future__ import annotations

import sys

import pytest
from toy_workload import TOY

from lab.workloads import Workload, register_workload


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
