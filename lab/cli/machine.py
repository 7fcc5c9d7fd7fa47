"""``python -m lab machine``: this machine's card (ISA, caches, measured GEMM and memory peaks; cached), the
fact sheet every verdict cites. The card itself is :mod:`lab.measure.machine`'s; ``--json [PATH]`` is spelled
here as in every subcommand (bare: the card as JSON on stdout; a PATH: the table printed, the JSON written)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from lab.cli.options import json_file, json_flag, write_json
from lab.measure import machine

NAME, HELP = "machine", "this machine's card: ISA, caches, measured GEMM / memory peaks (cached; lab.measure.machine)"


class _OneJsonSpelling:
    """The parser as :func:`lab.measure.machine.add_cli_arguments` sees it: its flags as they are, but ``--json``
    as :func:`lab.cli.options.json_flag` spells it in every subcommand."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._parser = parser

    def add_argument(self, *flags: str, **kwargs: Any) -> Any:
        if flags == ("--json",):
            return json_flag(self._parser, "the card")
        return self._parser.add_argument(*flags, **kwargs)


def add_arguments(p: argparse.ArgumentParser) -> None:
    machine.add_cli_arguments(_OneJsonSpelling(p))


def main(args: argparse.Namespace) -> int:
    out = json_file(args)
    if out is None:  # the card's own command: the table, or the JSON on stdout
        return machine.cli(argparse.Namespace(**{**vars(args), "json": args.json == "-"}))
    if args.as_isa:  # measured in a child with the kernels capped (machine.cli): its JSON read back from a pipe
        flags = [f for f, on in (("--refresh", args.refresh), ("--quick", args.quick)) if on]
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        proc = subprocess.run([sys.executable, "-m", "lab", "machine", "--as", args.as_isa, "--json", *flags],
                              stdout=subprocess.PIPE, text=True, env=env, check=False)
        if proc.returncode:
            return proc.returncode
        card = machine.MachineCard.from_dict(json.loads(proc.stdout))
    else:
        card = machine.machine_card(refresh=args.refresh, quick=args.quick,
                                    progress=lambda m: print(f"machine: {m}", file=sys.stderr, flush=True))
    print(machine.format_card(card, machine.card_path(card.hardware_id)))
    write_json(json.dumps(card.to_dict(), indent=1), out)
    return 0
