"""The registries: the single source of every name a user can type or a test can parametrise over.

One module, one :class:`Registry` class, for: workloads (:data:`WORKLOADS`), technique families
(:data:`FAMILIES`, in :data:`FAMILY_ORDER`) and their launchers (:data:`LAUNCHERS`), the technique options an
ablation stacks (:data:`OPTIONS`) and its recipes (:data:`RECIPES`), loaders (:data:`LOADERS`), storage presets
(:data:`STORAGES`) and the doctor's predictors (:data:`PREDICTORS`). Why a bottom-layer module: ``lab.config``
validates names and sits below the packages that own what the names mean. So the registries live here, the
owning module registers its entries when it is imported (``import lab`` imports every package), and config
validation, CLI choices, dashboard lists, the doctor and parametrised tests all read ``REGISTRY.names()``. A
name appears in the code exactly once: where it is registered (timm's ``register_model`` -> ``list_models()``
-> ``create_model``).
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

    def unregister(self, name: str) -> T | None:
        """Remove ``name`` (a test's temporary entry); returns what was there, ``None`` if nothing."""
        return self._items.pop(name, None)

    def pop(self, name: str, default: T | None = None) -> T | None:
        """``dict.pop`` spelling of :meth:`unregister`."""
        return self._items.pop(name, default)

    def copy(self) -> Registry[T]:
        """A private copy (a test registers into it and leaks nothing)."""
        other: Registry[T] = Registry(self.what)
        other._items = dict(self._items)
        return other

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

    def keys(self):  # noqa: ANN201 - dict keys view
        return self._items.keys()

    def items(self):  # noqa: ANN201 - dict items view
        return self._items.items()

    def values(self):  # noqa: ANN201 - dict values view
        return self._items.values()


#: Workload names -> :class:`lab.workloads.Workload` (:func:`lab.workloads.register_workload` adds to it).
WORKLOADS: Registry = Registry("workload")
#: Option names (``bf16``, ``prune_channels50``) -> :class:`lab.technique.Option`, each registered by the family
#: that owns it (``lab/<family>/options.py``); recipes, the crossover map, the doctor and the dashboard read them.
OPTIONS: Registry = Registry("technique")
#: The crossover map's names before the vocabulary was one: an old row name -> the option it timed. The map once
#: named its rows its own way (its ``prune50`` was channel pruning, the recipes' is L1 masks), so this table is for
#: stored maps only (:func:`lab.crossover.names.in_current_names`), never for a name a user types today (where
#: ``prune50`` means masks). Nothing new is written under an old name.
OLD_MAP_NAMES: dict[str, str] = {
    "auto": "amp_auto", "dynamic_int8": "int8_eager", "static_int8": "int8_static_legacy",
    "pt2e_static_int8": "int8_static", "prune50": "prune_channels50",
    "prune50_pt2e_int8": "prune_channels50+int8_static", "fused_optimizer": "fused_optim", "workers": "workers1",
}
#: Recipe names -> ``base RunConfig -> Ablation`` functions (registered by :mod:`lab.recipes`).
RECIPES: Registry = Registry("recipe")
#: Config fields -> the doctor's predictor for a technique that sets that field (:mod:`lab.doctor.predict`),
#: in the order the doctor asks them.
PREDICTORS: Registry = Registry("doctor predictor")
#: ``data.loader`` names -> loader builders (registered by :mod:`lab.data.loaders`).
LOADERS: Registry = Registry("data.loader")
#: ``data.storage`` names -> :class:`lab.data.storage.StoragePreset` (registered by :mod:`lab.data.storage`).
STORAGES: Registry = Registry("data.storage")
#: Technique family names -> :class:`lab.technique.Technique` (each package registers its own when imported).
FAMILIES: Registry = Registry("technique family")
#: Technique family names -> :class:`lab.technique.Launcher`: how a run of that family starts and ends its processes
#: (data-parallel spawns ranks, joins and leaves their group, wraps the model in DDP). Only a family that runs on
#: several processes registers one, under its family name; :meth:`lab.technique.TechniqueChain.launcher` picks it.
LAUNCHERS: Registry = Registry("launcher")
#: The order a run applies the families in (:func:`lab.technique.default_chain`): data builds the loader that
#: distributed slices; compute swaps in fast kernels before pruning sees the model; memory checkpoints the blocks
#: of the model that trains (after compute's swap) and counts the step by role around the precision policy
#: (after precision sets it), and hands pruning and quantization the plain model back after training; pruning
#: before quantization (int8 of a pruned model, never pruning of an int8 one). A new family is one package that
#: registers itself plus its name here.
FAMILY_ORDER = ("data", "compute", "precision", "memory", "pruning", "quant", "distributed")
