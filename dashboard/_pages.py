"""Every tab of the dashboard is a page: a ``dashboard/page_*.py`` defining ``TITLE: str`` and ``render()
-> None`` (and, optionally, a short ``TAB`` label for the tab row; ``TITLE`` otherwise), the built-in ones
(:data:`ORDER`, in that order: the Ablation tab first, grouped by what a person asks) as much as the others
(then sorted by file name), plus those in the folders of ``LAB_DASHBOARD_PAGES`` (``os.pathsep``-separated),
last; one tab each.

Why discovery: each family's page is written (and tested) on its own, and the app gains its tab without an
edit here. A page that fails to import, lacks ``TITLE`` / ``render``, or raises while it draws, becomes a
tab that shows the error (:func:`show`): one broken page must not take the whole dashboard down.

Why a separate ``TAB``: at 1280 px the main column is about 820 px wide and the tab row scrolled sideways with
the pages' full titles (the last tabs hidden behind an arrow); a page keeps its full title as its header and
shows a short label in the row. Keep a new page's label short too (one word where it can).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent
#: The built-in tabs, first and in this order (file stems in :data:`HERE`), grouped by what a person asks: what
#: should I use (the ablation, the doctor, where it pays by model size), where does the time go (loading, loader
#: workers vs threads), how does it scale (the full run, the scaling model), this machine, stored runs and the
#: report. The Doctor tab was seventh of ten; any other page follows by name.
ORDER = ("page_ablation", "page_doctor", "page_scale", "page_data_loading", "page_data_threads", "page_project",
         "page_scaling_model", "page_machine", "page_stored_runs", "page_performance_report")


@dataclass
class Page:
    path: Path
    title: str
    render: Callable[[], None] | None = None
    error: str | None = None
    tab: str = ""  # the tab row's label: the page's TAB, else its title

    def __post_init__(self) -> None:
        self.tab = self.tab or self.title


def _folders() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("LAB_DASHBOARD_PAGES", "").split(os.pathsep) if p.strip()]
    return [HERE, *extra]


def _load(path: Path) -> Page:
    name = f"lab_dashboard_{path.stem}"
    fallback = path.stem.removeprefix("page_").replace("_", " ")
    mtime = path.stat().st_mtime
    module = sys.modules.get(name)
    try:
        if module is None or getattr(module, "__lab_page_mtime__", None) != mtime or \
                getattr(module, "__file__", None) != str(path):
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses and pickling inside the page need it registered
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
            module.__lab_page_mtime__ = mtime
        title, render = getattr(module, "TITLE", None), getattr(module, "render", None)
        if not isinstance(title, str) or not title.strip():
            return Page(path, fallback, error=f"{path.name} defines no TITLE string")
        if not callable(render):
            return Page(path, title, error=f"{path.name} defines no render() function")
        tab = getattr(module, "TAB", None)
        return Page(path, title, render=render, tab=tab.strip() if isinstance(tab, str) and tab.strip() else title)
    except Exception as exc:  # a broken page: its tab says why, the others still work
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3))
        return Page(path, fallback, error=f"{path.name} failed to import: {type(exc).__name__}: {exc}\n\n{tb}")


def _rank(path: Path) -> tuple[int, str]:
    return (ORDER.index(path.stem) if path.stem in ORDER else len(ORDER), path.name)


def discover() -> list[Page]:
    """The pages: this folder's (:data:`ORDER` first, the rest by file name), then each extra folder's by name."""
    pages = []
    for i, folder in enumerate(_folders()):
        if folder.is_dir():
            found = folder.glob("page_*.py")
            pages += [_load(p) for p in (sorted(found, key=_rank) if i == 0 else sorted(found))]
    return pages


def show(page: Page) -> None:
    """Draw one page in the current container; its import error or its exception instead, as a message
    (``st.rerun`` and ``st.stop`` are not exceptions: they pass through)."""
    if page.render is None:
        st.error(page.error)
        return
    try:
        page.render()
    except Exception as exc:  # one page's bug must not blank the others
        st.error(f"{page.path.name}: {type(exc).__name__}: {exc}")
