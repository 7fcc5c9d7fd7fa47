"""What every dashboard page shares: the one results-store handle (``st.cache_resource``, keyed by the store's
path) and where the benchmark reports live.

Why one cached handle: each ``with ResultStore()`` opened a SQLite connection, set its pragmas and re-ran the
schema statements (the app opened eight per rerun, one more per second while a job's progress refreshed).
The handle is thread-safe (one connection behind a lock) and every statement outside a transaction reads
the latest commit, so the worker's writes show at once. Keyed by the path (``$LAB_RESULTS_DB``, read on every
call), so a test's private store gets its own handle; a handle whose file was removed, or that someone
closed, is opened again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import streamlit as st

from lab import ResultStore, list_workloads
from lab.store import default_store_path
from lab.workloads import load_spec

ROOT = Path(__file__).resolve().parents[1]


def _usable(handle: ResultStore) -> bool:
    try:
        handle.conn  # noqa: B018 - raises once closed
    except RuntimeError:
        return False
    return str(handle.path) == ":memory:" or handle.path.exists()


@st.cache_resource(show_spinner=False, validate=_usable)
def _open(path: str) -> ResultStore:
    return ResultStore(path)


def store() -> ResultStore:
    """The results store every page and fragment uses (never close it: ``with`` would, for all of them)."""
    return _open(str(default_store_path()))


def bench_root() -> Path:
    """The benchmark reports' folder: ``$LAB_BENCH_RESULTS`` or ``benchmarks/results`` of this checkout."""
    return Path(os.environ.get("LAB_BENCH_RESULTS") or ROOT / "benchmarks" / "results")


@st.cache_resource(show_spinner=False)
def _typed_anywhere() -> set[str]:
    """Workload names some browser tab typed a spec for (the registry is one per process, so they are in it)."""
    return set()


def add_typed_workload(spec: str) -> list[str]:
    """Load ``spec`` for this browser tab only: its names join this session's list (``st.session_state``), and
    every other tab keeps the built-in list and default. Raises ``ValueError`` / ``ImportError`` / ``OSError``."""
    names = load_spec(spec)
    _typed_anywhere().update(names)
    mine = st.session_state.setdefault("_typed_workloads", [])
    mine.extend(n for n in names if n not in mine)
    return names


def workload_names() -> list[str]:
    """The workloads this tab may pick: the built-in ones and ``LAB_WORKLOADS``, plus the ones this tab typed
    (never another tab's: a typed spec is not a global default)."""
    mine = set(st.session_state.get("_typed_workloads", []))
    return [n for n in list_workloads() if n not in _typed_anywhere() or n in mine]


#: Pixels per character and per cell's padding for the dataframe's 14 px Source Sans, on the generous side: a
#: column sized from them shows its longest text whole. Streamlit's grid sizes a column to its text itself only
#: up to 500 px (its ``maxColumnAutoWidth``) and cuts the rest with an ellipsis; 1000 px is its widest column.
PX_PER_CHAR, PX_PAD, AUTO_MAX_PX, MAX_PX = 7.4, 28, 480, 1000


def column_widths(data: Any) -> dict[str, Any]:
    """A ``column_config`` for ``st.dataframe`` that widens each column whose header or longest text is wider
    than the grid would size it (a reason, a figure's name, a long header): the whole text in one line, the
    table scrolling sideways when it must, instead of a cut "…"."""
    import pandas as pd  # noqa: PLC0415 - pandas is loaded by then; kept out of the page's import time

    frame = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data)
    out: dict[str, Any] = {}
    for col in frame.columns:
        texts = [str(col), *(str(v) for v in frame[col].head(200).tolist())]
        px = int(max(len(t) for t in texts) * PX_PER_CHAR + PX_PAD)
        if px > AUTO_MAX_PX:
            out[str(col)] = st.column_config.Column(width=min(px, MAX_PX))
    return out


def dataframe(data: Any, **kwargs: Any) -> Any:
    """``st.dataframe`` with :func:`column_widths` (a caller's own ``column_config`` wins)."""
    config = {**column_widths(data), **(kwargs.pop("column_config", None) or {})}
    return st.dataframe(data, column_config=config or None, **kwargs)
