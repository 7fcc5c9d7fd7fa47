"""Root conftest: pytest-randomly shuffles the test order (so tests cannot depend on each other), but a
notebook's cells are one program and must run top to bottom in one kernel. This hook runs after the
shuffle and moves the notebooks to the end, each notebook's cells together and in order."""

from __future__ import annotations

import re


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
