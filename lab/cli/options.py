"""Command-line options shared by the subcommands: the configuration from the config's own flags, the one
results-store flag, output paths checked before any work, and the usage error every subcommand reports as one
line with exit status 2."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.config import FAMILIES, RunConfig, load_workload


class UsageError(Exception):
    """A user mistake on the command line: reported as one line, exit status 2."""


class _DeprecatedStoreFlag(argparse.Action):
    """``--db`` (the old name in ``ablate`` and ``doctor``): still accepted for one release, with a warning; the
    results store is ``--store`` in every subcommand."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001 - argparse's API
        print(f"lab: warning: {option_string} is deprecated; use --store", file=sys.stderr)
        namespace.store = values


def config_from_args(args: argparse.Namespace, *, defaults: dict[str, Any] | None = None) -> RunConfig:
    """The RunConfig the flags describe: only flags the user gave override ``defaults`` (the subcommand's base,
    e.g. an ablation's) and then :class:`RunConfig`'s defaults (config flags default to ``argparse.SUPPRESS``)."""
    keys = {f.name for f in dataclasses.fields(RunConfig) if f.name not in FAMILIES}
    keys |= {f"{fam}.{f.name}" for fam, cls in FAMILIES.items() for f in dataclasses.fields(cls)}
    overrides = {k: v for k, v in vars(args).items() if k in keys}
    # the workload spec loaded now: a bad one is one line before any work (a RunConfig itself imports nothing)
    return load_workload(RunConfig().with_overrides(**{**(defaults or {}), **overrides}))


def store_flags(parser: argparse.ArgumentParser | Any, help_text: str) -> None:
    """``--store PATH`` (and the deprecated ``--db`` alias) on ``parser`` or one of its argument groups."""
    parser.add_argument("--store", metavar="PATH", default=None, help=help_text)
    parser.add_argument("--db", metavar="PATH", action=_DeprecatedStoreFlag, help=argparse.SUPPRESS)


def json_flag(parser: argparse.ArgumentParser | Any, what: str) -> None:
    """``--json [PATH]``, one spelling in every subcommand: bare, ``what`` is printed as JSON on stdout instead of
    the text; with a PATH the text is printed as usual and the JSON written there (``-``: stdout)."""
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                        help=f"{what} as JSON: bare --json prints it instead of the text; --json PATH writes it "
                             "to PATH (checked before any work) and prints the text")


def json_file(args: argparse.Namespace) -> Path | None:
    """The file ``--json PATH`` names, refused now if it cannot be written (:func:`writable_file`); ``None`` for a
    bare ``--json`` (stdout) or none."""
    return writable_file(args.json, "--json") if args.json not in (None, "-") else None


def write_json(text: str, path: Path) -> None:
    """Write ``text`` (one JSON document) to ``path``, creating its folder, and say where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    print(f"wrote {path}")


def print_written(write: Callable[[Any, Path], Path], obj: Any) -> int:
    """Bare ``--json``: print exactly what ``write(obj, path)`` would put in a file (the strict JSON, figures and
    all), so stdout and ``--json PATH`` never differ; returns exit status 0."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(write(obj, Path(tmp) / "out.json").read_text())
    return 0


def writable_file(path: str, flag: str) -> Path:
    """Refuse, before any work, an output path that cannot become a file: a folder, a path under a file, a
    folder that cannot be written or created. Nothing is left behind here: the check creates a probe (a
    temporary file, or a temporary folder where ``out``'s folder is still missing) and removes it, because
    permission bits lie (root on a read-only mount, ``/proc``)."""
    import tempfile

    from lab.store import check_file_target

    out = Path(path)
    check_file_target(out, flag, "out.csv")
    parent = next((p for p in out.parents if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{flag} {out}: the folder {parent} is not writable")
    try:
        if parent == out.parent:
            with tempfile.TemporaryFile(dir=parent):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(dir=parent))
    except OSError as exc:
        what = "is not writable" if parent == out.parent else f"cannot hold the folder {out.parent}"
        raise UsageError(f"{flag} {out}: the folder {parent} {what} ({exc.strerror or exc})") from None
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"{flag} {out} is read-only")
    return out


__all__ = ["UsageError", "config_from_args", "json_file", "json_flag", "print_written", "store_flags", "writable_file",
           "write_json"]
