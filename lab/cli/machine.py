"""``python -m lab machine``: this machine's card (ISA, caches, measured GEMM and memory peaks; cached), the
fact sheet every verdict cites. The card itself is :mod:`lab.measure.machine`'s."""

from __future__ import annotations

import argparse

from lab.measure import machine

NAME, HELP = "machine", "this machine's card: ISA, caches, measured GEMM / memory peaks (cached; lab.measure.machine)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    machine.add_cli_arguments(p)


def main(args: argparse.Namespace) -> int:
    return machine.cli(args)
