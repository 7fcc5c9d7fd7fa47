"""Shared fixtures of the dashboard tests: the page lifecycle's worker run in this process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def diagnose_fn() -> Callable[..., Any] | None:
    """The diagnosis the inline worker runs for a ``diagnose@`` job: ``None``, the doctor's own (the job's spec);
    a test module overrides this fixture with a faster one."""
    return None


@pytest.fixture
def launched(monkeypatch, diagnose_fn) -> list[str]:
    """The pages' doctor-worker launches, run here (``_lifecycle.start_worker`` replaced by what the worker process
    calls, :func:`lab.doctor.jobs.run_job`): no process is spawned, the job row and the store are the real ones.
    Returns the keys launched, in order."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "dashboard"))
    import _lifecycle

    from lab import ResultStore
    from lab.doctor import jobs as doctor_jobs

    keys: list[str] = []

    def inline(store_path, key, token, module="lab.ablation.worker"):
        assert module == doctor_jobs.WORKER
        keys.append(key)
        with ResultStore(store_path) as store:
            if diagnose_fn is not None and key.startswith("diagnose@"):
                doctor_jobs.run_diagnosis(store, key, token, diagnose_fn=diagnose_fn)
            else:
                doctor_jobs.run_job(store, key, token)

    monkeypatch.setattr(_lifecycle, "start_worker", inline)
    return keys
