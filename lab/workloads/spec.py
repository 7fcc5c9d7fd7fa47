"""Workload specs: bring a workload from a module or a file, on the CLI, in the dashboard, in every process.

A spec is ``package.module:NAME`` or ``path/to/file.py:NAME``; ``NAME`` is a :class:`Workload`, a zero-argument
callable returning one, or a list of them. Three doors use it, and all end in ``register_workload``:

- ``--workload SPEC`` (``RunConfig(workload=SPEC)``): the config keeps the registered name in ``workload`` and
  the spec in ``workload_spec``, so a spawned DDP rank (a fresh process) loads the same file before it runs;
- ``LAB_WORKLOADS=SPEC[,SPEC...]``: loaded by every process on its first registry lookup (CLI, dashboard,
  notebooks, ranks);
- installed packages: an entry point in the group ``lab.workloads`` whose object is a NAME as above.

A spec that cannot be imported is one ``ValueError`` naming the spec and the import error.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import Workload, register_workload, registered

ENV_VAR = "LAB_WORKLOADS"
ENTRY_POINT_GROUP = "lab.workloads"
_LOADED: dict[str, list[str]] = {}  # spec -> names it registered (loading a spec twice imports it once)
_SPEC_OF: dict[str, str] = {}  # workload name -> the spec it came from
_environment_loaded = False


def is_spec(text: str) -> bool:
    """``module:NAME`` or ``file.py:NAME`` (a registered name never contains a colon)."""
    return isinstance(text, str) and ":" in text


def _import_target(spec: str) -> Any:
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise ValueError("expected package.module:NAME or path/to/file.py:NAME")
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        mod_name = f"lab_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        module = sys.modules.get(mod_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise ImportError(f"cannot import {path}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module  # functions defined there must be findable (pickling, dataclasses)
            try:
                loader_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(mod_name, None)
                raise
    else:
        module = importlib.import_module(where)
    if not hasattr(module, attr):
        raise AttributeError(f"{where} has no attribute {attr!r}")
    return getattr(module, attr)


def _workloads_of(obj: Any) -> list[Workload]:
    if isinstance(obj, Workload):
        return [obj]
    if isinstance(obj, (list, tuple)):
        out = [w for item in obj for w in _workloads_of(item)]
        if not out:
            raise ValueError("the list is empty")
        return out
    if callable(obj):
        return _workloads_of(obj())
    raise TypeError(f"expected a Workload, a zero-argument callable returning one, or a list; got {type(obj).__name__}")


def load_spec(spec: str) -> list[str]:
    """Import ``spec``, register what it names and return the registered names (in order)."""
    if spec in _LOADED:
        return list(_LOADED[spec])
    try:
        workloads = _workloads_of(_import_target(spec))
        names = []
        for wl in workloads:
            before = registered(wl.name)
            if before is not None and before is not wl and wl.name not in _SPEC_OF:
                raise ValueError(f"it defines workload {wl.name!r}, which is already registered (built-in or "
                                 "from Python); rename it")
            register_workload(wl, overwrite=True)
            _SPEC_OF[wl.name] = spec
            names.append(wl.name)
    except Exception as exc:  # one line that names the spec and the import error
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"workload spec {spec!r} cannot be loaded: {type(exc).__name__}: {first}") from exc
    _LOADED[spec] = names
    return list(names)


def spec_of(name: str) -> str | None:
    """The spec a registered workload was loaded from (``None`` for built-ins and Python registrations)."""
    return _SPEC_OF.get(name)


def _entry_points() -> list[tuple[str, Callable[[], Any]]]:
    try:
        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken installed distribution must not break the lab
        return []
    return [(f"entry point {ep.name} ({ep.value})", ep.load) for ep in eps]


def load_environment() -> None:
    """Load ``LAB_WORKLOADS`` and the ``lab.workloads`` entry points once per process (first registry lookup)."""
    global _environment_loaded
    if _environment_loaded:
        return
    _environment_loaded = True
    for spec in (s.strip() for s in os.environ.get(ENV_VAR, "").split(",")):
        if spec:
            try:
                load_spec(spec)
            except ValueError as exc:
                _environment_loaded = False  # a fixed environment may be retried
                raise ValueError(f"{ENV_VAR}: {exc}") from None
    for label, load in _entry_points():
        try:
            for wl in _workloads_of(load()):
                register_workload(wl, overwrite=True)
        except Exception as exc:
            raise ValueError(f"workload {label} cannot be loaded: {type(exc).__name__}: {exc}") from None
