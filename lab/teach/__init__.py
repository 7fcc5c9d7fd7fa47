"""Exercises for the notebooks: a learner's "your turn" cell, its reference solution and its checker.

A notebook's exercise cell defines a stub (``...`` then ``raise NotImplementedError``) that the learner fills in,
and passes it through :func:`use_solution`: with ``LAB_SOLUTIONS=1`` (what CI sets, so the notebooks pass
unfilled) the stub is swapped for the reference in :mod:`lab.teach.solutions`; otherwise the learner's own
function is kept. The checker cell then calls the matching function of :mod:`lab.teach.checks`, which holds
the answer against the library's own result (torch's quantizer, ``tensor.to(torch.bfloat16)``, lab's
functions) and raises ``AssertionError`` with a hint when it differs.

Nothing in ``lab`` imports this package (pyproject.toml's layer contract puts it on top).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def solutions_on() -> bool:
    """True when ``LAB_SOLUTIONS`` is set to anything but ``""`` / ``"0"``."""
    return os.environ.get("LAB_SOLUTIONS", "") not in ("", "0")


def use_solution(fn: F) -> F:
    """``fn`` itself, or the reference solution of the same name when :func:`solutions_on`."""
    if not solutions_on():
        return fn
    from lab.teach import solutions

    if not hasattr(solutions, fn.__name__):
        raise KeyError(f"lab.teach.solutions has no reference for {fn.__name__!r}")
    return getattr(solutions, fn.__name__)


__all__ = ["solutions_on", "use_solution"]
