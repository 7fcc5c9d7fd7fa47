"""Command-line flags generated from the config dataclasses: a new config field is a new flag, with no CLI change.

A top-level field ``batch_size`` is ``--batch-size``, a family field ``data.num_workers`` is
``--data-num-workers``; the common ones have short aliases; a field whose values live in a registry offers
that registry's names. Every flag's help is its field's meaning (the config class's ``HELP``, next to the field)
followed by the allowed values and the default: ``meaning (allowed: a, b; default: a)``. Used by ``run``,
``ablate``, ``project`` and ``doctor`` (they take the same configuration)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from lab.config import FAMILIES, MODEL_SCALES, OPTIMIZERS, SIZES, RunConfig
from lab.registry import LOADERS, STORAGES, WORKLOADS

ALIASES = {
    "precision.dtype": "--precision", "data.loader": "--loader", "data.num_workers": "--num-workers",
    "data.prefetch_factor": "--prefetch-factor", "data.pin_memory": "--pin-memory",
    "prune.method": "--prune", "prune.amount": "--prune-amount", "quant.method": "--quant",
    "ddp.world_size": "--world-size",
}
#: Fields whose flag has a new name: the generated one (``--ddp-grad-accum-steps``) stays as a deprecated alias
#: that warns on stderr (gradient accumulation is a single-process technique too).
RENAMED = {"ddp.grad_accum_steps": "--grad-accum-steps"}
#: Fields whose allowed values are a registry's names (the single source of those names): argparse offers them.
CHOICES = {"data.loader": LOADERS, "data.storage": STORAGES}
#: Allowed values listed in a flag's help, from the tuples the configs validate against. Not argparse choices:
#: the config's own message for a bad value (it names the field) is what a user sees. ``workload`` lists the
#: registered names at the time the parser is built (a spec is allowed too; LAB_WORKLOADS loads after parsing).
#: A family's fields list what its config class declares (``ALLOWED``, beside the fields).
ALLOWED: dict[str, Any] = {
    "workload": WORKLOADS, "size": SIZES, "optimizer": OPTIMIZERS, "model_scale": MODEL_SCALES,
    **{f"{key}.{name}": values for key, cls in FAMILIES.items() for name, values in cls.ALLOWED.items()}, **CHOICES,
}


class DeprecatedFlag(argparse.Action):
    """An old spelling of a flag: still accepted, with a one-line warning on stderr naming the new one."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001 - argparse's API
        print(f"lab: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def field_help(key: str, f: dataclasses.Field) -> str:
    """``meaning (allowed: a, b; default: x)`` for the field ``key`` (``batch_size``, ``data.num_workers``)."""
    fam, _, name = key.rpartition(".")
    meaning = (FAMILIES[fam] if fam else RunConfig).HELP.get(name, "")
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    extra = []
    if key in ALLOWED:
        names = ALLOWED[key].names() if hasattr(ALLOWED[key], "names") else ALLOWED[key]
        extra.append("allowed: " + ", ".join(map(str, names)))
    extra.append("default: " + _shown(default))
    text = f"{meaning} ({'; '.join(extra)})" if meaning else f"({'; '.join(extra)})"
    return text.replace("%", "%%")  # argparse %-formats help


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(value) or "empty"
    return str(value)


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
    generated = "--" + key.replace(".", "-").replace("_", "-")
    flags = [RENAMED.get(key, generated)]
    if key in ALIASES and ALIASES[key] not in flags:
        flags.insert(0, ALIASES[key])
    ann = str(f.type)
    kwargs: dict[str, Any] = {"dest": key, "default": argparse.SUPPRESS, "help": field_help(key, f)}
    if ann == "bool":
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = _converter(ann, key)
        kwargs["metavar"] = key.split(".")[-1].upper()
        if key in CHOICES:
            kwargs["choices"] = CHOICES[key].names()
            kwargs["metavar"] = "{" + ",".join(CHOICES[key].names()) + "}"
    group.add_argument(*flags, **kwargs)
    if key in RENAMED:
        old = {k: v for k, v in kwargs.items() if k not in ("action", "help")}
        group.add_argument(generated, action=DeprecatedFlag, new=RENAMED[key], help=argparse.SUPPRESS, **old)


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
