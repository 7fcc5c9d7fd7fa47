"""``python -m lab runs``: the latest stored runs, as a table."""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.cli.options import UsageError

NAME, HELP = "runs", "list stored runs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", metavar="PATH", help="results database (default: $LAB_RESULTS_DB or results/lab.sqlite)")
    p.add_argument("--workload", help="only the runs of this workload")
    p.add_argument("--label", help="only the runs stored with this label")
    p.add_argument("--limit", type=int, default=20, help="the latest N runs (default: 20)")


def main(args: argparse.Namespace) -> int:
    from lab.store import ResultStore, default_store_path

    if args.limit < 1:
        raise UsageError(f"--limit {args.limit} is invalid: allowed: >= 1 (the number of latest runs shown)")
    path = Path(args.store) if args.store else default_store_path()
    if not path.exists():
        print(f"no runs in {path} (no results database yet)")
        return 0
    with ResultStore(path, read_only=True) as store:
        df = store.load_runs(workload=args.workload, label=args.label)
        path = store.path
    if df.empty:
        print(f"no runs in {path}")
        return 0
    cols = [c for c in ("run_id", "started_at", "label", "workload", "size", "status", "metric_name", "metric",
                        "train_time_s", "median_step_ms", "throughput_samples_per_s", "hardware_id")
            if c in df.columns]
    df = df.sort_values("started_at").tail(args.limit)[cols]
    df["run_id"] = df["run_id"].str[:8]
    print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"({len(df)} shown; store: {path})")
    return 0
