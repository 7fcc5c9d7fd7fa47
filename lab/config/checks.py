"""Field validators: every bad value fails with the field's name, the value and what is allowed."""

from __future__ import annotations

import math
from typing import Any


def fail(name: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{name}={value!r} is invalid: {allowed}")


def check_choice(name: str, value: Any, allowed: tuple[str, ...], *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if value not in allowed:
        fail(name, value, "allowed: " + ", ".join(allowed))


def check_int(name: str, value: Any, *, lo: int | None = None, hi: int | None = None,
               optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        fail(name, value, "must be an integer" + (" or None" if optional else ""))
    if lo is not None and value < lo:
        fail(name, value, f"must be >= {lo}")
    if hi is not None and value > hi:
        fail(name, value, f"must be <= {hi}")


def check_float(name: str, value: Any, *, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False, hi_open: bool = False, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fail(name, value, "must be a finite number" + (" or None" if optional else ""))
    if lo is not None and (value <= lo if lo_open else value < lo):
        fail(name, value, f"must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        fail(name, value, f"must be {'<' if hi_open else '<='} {hi}")


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(name, value, "must be True or False")
