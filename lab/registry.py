"""Registries: the single source of the names a user can type (loaders, storage presets, ...).

Why a bottom-layer module: ``lab.config`` validates names and sits below the technique packages, which own
what the names mean. So the names live here, the owning package registers its builders under them when it
is imported (``import lab`` imports every package), and config validation, CLI choices, dashboard lists and
parametrised tests all read ``REGISTRY.names()``. A name appears in the code exactly once: where it is
registered. Workloads, techniques and recipes have registries of their own in their packages
(``lab.workloads``, ``lab.recipes``), built on the same :class:`Registry`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> objects, in registration order; an unknown name is a ``ValueError`` listing the known ones."""

    def __init__(self, what: str) -> None:
        self.what = what  # the config field or concept the names are for, used in error messages
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T, *, overwrite: bool = False) -> T:
        """Add ``item`` under ``name`` and return it; a duplicate raises unless ``overwrite`` (two modules
        silently fighting over one name would make behaviour depend on import order)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.what}: a name must be a non-empty string, got {name!r}")
        if name in self._items and not overwrite:
            raise ValueError(f"{self.what} {name!r} is already registered; pass overwrite=True to replace it")
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"{self.what}={name!r} is invalid: allowed: {', '.join(self._items)}") from None

    __getitem__ = get

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self):  # noqa: ANN201 - dict items view
        return self._items.items()

    def values(self):  # noqa: ANN201 - dict values view
        return self._items.values()


#: ``data.loader`` names -> loader builders (registered by :mod:`lab.data.loaders`).
LOADERS: Registry = Registry("data.loader")
#: ``data.storage`` names -> :class:`lab.data.storage.StoragePreset` (registered by :mod:`lab.data.storage`).
STORAGES: Registry = Registry("data.storage")
