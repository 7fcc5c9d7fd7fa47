"""Root conftest: pytest-randomly shuffles the test order (so tests cannot depend on each other), but a
notebook's cells are one program and must run top to bottom in one kernel. This hook runs after the
shuffle and moves the notebooks to the end, each notebook's cells together and in order. Their kernels
start without the settle wait (below)."""

from __future__ import annotations

import os
import re

import pytest


def _cell_number(item) -> int:
    match = re.search(r"::Cell (\d+)$", item.nodeid)
    return int(match.group(1)) if match else 0


def pytest_collection_modifyitems(config, items) -> None:
    cells = [item for item in items if item.nodeid.split("::", 1)[0].endswith(".ipynb")]
    if not cells:
        return
    tests = [item for item in items if not item.nodeid.split("::", 1)[0].endswith(".ipynb")]
    cells.sort(key=lambda item: (item.nodeid.split("::", 1)[0], _cell_number(item)))
    items[:] = tests + cells


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """Before a notebook's kernel starts (its first cell's setup), ``LAB_SETTLE_MAX_S=0``: no wait for a quiet
    machine before each ablation run, as ``tests/conftest.py`` gives the tests (the suite asserts no timings;
    the wait cost notebook 06's stacked ablation ~6 s on a busy box). The notebooks run last, after the browser
    test that waits as a user's page would, so the setting reaches nothing else."""
    if item.nodeid.split("::", 1)[0].endswith(".ipynb"):
        os.environ.setdefault("LAB_SETTLE_MAX_S", "0")
