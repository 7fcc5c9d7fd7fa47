"""Command-line flags generated from the config dataclasses: a new config field is a new flag, with no CLI change.

A top-level field ``batch_size`` is ``--batch-size``, a family field ``data.num_workers`` is
``--data-num-workers``; the common ones have short aliases; a field whose values live in a registry offers
that registry's names. Used by ``run`` and ``doctor`` (they take the same configuration)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from lab.config import FAMILIES, RunConfig
from lab.registry import LOADERS, STORAGES

ALIASES = {
    "precision.dtype": "--precision", "data.loader": "--loader", "data.num_workers": "--num-workers",
    "data.prefetch_factor": "--prefetch-factor", "data.pin_memory": "--pin-memory",
    "prune.method": "--prune", "prune.amount": "--prune-amount", "quant.method": "--quant",
    "ddp.world_size": "--world-size",
}
#: Fields whose allowed values are a registry's names (the single source of those names).
CHOICES = {"data.loader": LOADERS, "data.storage": STORAGES}


def _converter(annotation: str, key: str):
    optional = "None" in annotation
    if annotation.startswith("tuple"):
        return lambda s: tuple(x.strip() for x in s.split(",") if x.strip())

    base = int if annotation.startswith("int") else float if annotation.startswith("float") else str

    def convert(text: str) -> Any:
        if optional and text.lower() == "none":
            return None
        try:
            return base(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {base.__name__}, got {text!r}") from None

    convert.__name__ = base.__name__  # argparse names the type in its error message
    return convert


def _add_field(group: argparse._ArgumentGroup, key: str, f: dataclasses.Field) -> None:
    flags = ["--" + key.replace(".", "-").replace("_", "-")]
    if key in ALIASES:
        flags.insert(0, ALIASES[key])
    ann = str(f.type)
    kwargs: dict[str, Any] = {"dest": key, "default": argparse.SUPPRESS}
    if ann == "bool":
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = _converter(ann, key)
        kwargs["metavar"] = key.split(".")[-1].upper()
        if key in CHOICES:
            kwargs["choices"] = CHOICES[key].names()
            kwargs["metavar"] = "{" + ",".join(CHOICES[key].names()) + "}"
    group.add_argument(*flags, **kwargs)


def add_config_fields(p: argparse.ArgumentParser) -> None:
    """One flag per config field (``run`` and ``doctor`` take the same configuration)."""
    core = p.add_argument_group("run")
    for f in dataclasses.fields(RunConfig):
        if f.name not in FAMILIES:
            _add_field(core, f.name, f)
    for fam, cls in FAMILIES.items():
        group = p.add_argument_group(fam)
        for f in dataclasses.fields(cls):
            _add_field(group, f"{fam}.{f.name}", f)
