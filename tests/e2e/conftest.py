"""Fixtures of the end-to-end tests (tests/e2e/): ``no_work`` fails a fault test whose error comes after work began."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if data preparation or a rank spawn starts: the error must come before any work."""
    import lab.distributed.launch as launch
    import lab.train

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the error")

    monkeypatch.setattr(lab.train, "prepare", refuse)
    monkeypatch.setattr(launch, "spawn", refuse)
