"""Pages other than the built-in tabs: every ``dashboard/page_*.py`` (sorted by file name), plus those in
the folders of ``LAB_DASHBOARD_PAGES`` (``os.pathsep``-separated), each defining ``TITLE: str`` and
``render() -> None``; one tab each, after the built-in tabs.

Why discovery: each family's page is written (and tested) on its own, and the app gains its tab without an
edit here. A page that fails to import, or lacks ``TITLE`` / ``render``, becomes a tab that shows the error:
one broken page must not take the whole dashboard down.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass
class Page:
    path: Path
    title: str
    render: Callable[[], None] | None = None
    error: str | None = None


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
        return Page(path, title, render=render)
    except Exception as exc:  # a broken page: its tab says why, the others still work
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3))
        return Page(path, fallback, error=f"{path.name} failed to import: {type(exc).__name__}: {exc}\n\n{tb}")


def discover() -> list[Page]:
    """The pages, sorted by file name (the built-in folder first, then each extra folder)."""
    pages = []
    for folder in _folders():
        if folder.is_dir():
            pages += [_load(p) for p in sorted(folder.glob("page_*.py"))]
    return pages
