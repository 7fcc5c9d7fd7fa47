"""``python -m lab export``: every stored run as one CSV."""

from __future__ import annotations

import argparse

NAME, HELP = "export", "export stored runs as CSV"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", metavar="PATH",
                   help="results database to read (default: $LAB_RESULTS_DB or results/lab.sqlite)")
    p.add_argument("--out", metavar="CSV", required=True, help="the CSV file to write, one row per stored run")


def main(args: argparse.Namespace) -> int:
    from lab.store import ResultStore

    with ResultStore(args.store, read_only=True) as store:  # a missing database is an error, not a new one
        path = store.export_csv(args.out)
        print(f"wrote {store.count()} runs to {path}")
    return 0
