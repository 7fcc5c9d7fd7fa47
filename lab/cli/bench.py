"""``python -m lab bench``: run ``benchmarks/*.py``, write their JSON and the performance report."""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.cli.options import UsageError

NAME, HELP = "bench", "run benchmarks/*.py and write their JSON"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="each benchmark's short setting")
    p.add_argument("--only", help="comma-separated benchmark names (default: all)")
    p.add_argument("--out", metavar="DIR",
                   help="default: benchmarks/results/<hardware-id>/ (<hardware-id>-quick/ with --quick)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: re-render report.json / report.md from the JSON already in --out")
    p.add_argument("--update-readme", action="store_true",
                   help="also rewrite the generated tables in docs/results.md from every benchmarks/results/*/ "
                        "report and map")


def main(args: argparse.Namespace) -> int:
    from lab import bench

    scripts = bench.benchmark_scripts(only=args.only)
    out_dir = Path(args.out) if args.out else bench.default_out_dir(args.quick)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file; give a folder for the benchmark results")
    if args.report_only and not out_dir.is_dir():
        raise UsageError(f"--report-only: {out_dir} does not exist (run `python -m lab bench` first)")
    failed, _ = ([], {}) if args.report_only else bench.run_benchmarks(scripts, out_dir, quick=args.quick)
    _, md_path, report = bench.write_report(out_dir, new_results=not args.report_only)
    flagged = [r["name"] for r in report["rows"] if r.get("within_ci") is False]
    print(f"results in {out_dir}; report {md_path}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    if flagged:
        print(f"not reproduced within the previous run's CI ({len(flagged)}): " + "; ".join(flagged))
    if args.update_readme:
        page = bench.RESULTS_PAGE
        done = bench.update_readme(page, bench.BENCH_DIR / "results")
        print(f"results table {'updated' if done else f'NOT updated ({page} has no report markers)'}")
        from lab.crossover.report import write_cross_hardware

        done = write_cross_hardware(page, bench.BENCH_DIR / "results")
        print(f"cross-hardware table {'updated' if done else f'NOT updated ({page} has no cross-hardware markers)'}")
    return 1 if failed else 0
