"""``python -m lab crossover``: map each technique's speedup against model size along the ladders (the machine
card first: the map cites its peaks), or ``--threads-study``: the map at 1 thread against all cores."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.cli.options import UsageError, json_file, json_flag
from lab.config import RunConfig
from lab.measure import machine

NAME, HELP = "crossover", "map each technique's speedup against model size (the ladders)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", default="", help="comma-separated (default: ctr,sequence,vision,transformer,mlp)")
    p.add_argument("--techniques", default="", help="comma-separated (default: all; --quick: the cheap ones)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for every arm (default 1)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 5; --quick 4)")
    p.add_argument("--quick", action="store_true", help="4 rungs per workload, cheap techniques (~2-3 min)")
    p.add_argument("--include-emulated", action="store_true",
                   help="--quick: also time bf16 / fp16 where this CPU runs them emulated (skipped by default: "
                   "a reference path that cannot pay, and most of the quick map's time on an AVX2 CPU)")
    json_flag(p, "the map (with --threads-study: the study)")
    p.add_argument("--threads-study", action="store_true", help="the map at 1 thread vs all cores, and loader "
                   "workers vs compute threads along the vision ladder (lab.crossover.threads)")


def main(args: argparse.Namespace) -> int:
    from lab import crossover

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    techniques = [t.strip() for t in args.techniques.split(",") if t.strip()]
    if args.threads_study:
        return _threads_study(args, workloads, techniques)
    workloads = workloads or list(crossover.MAP_WORKLOADS)
    techniques = techniques or list(crossover.QUICK_TECHNIQUES if args.quick else crossover.TECHNIQUES)
    crossover.check_names(workloads, techniques)
    RunConfig(threads=args.threads)  # the same threads check as a run: one line, before any work
    if args.repeats is not None and args.repeats < 3:
        raise UsageError(f"--repeats {args.repeats}: need >= 3 rounds for a confidence interval")
    out = json_file(args)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731 - progress to stderr
    machine.machine_card(quick=args.quick, progress=say)  # cached after the first: the map cites its peaks
    the_map = crossover.build_map(workloads, techniques, quick=args.quick, threads=args.threads,
                                  repeats=args.repeats, progress=lambda m: print(m, file=sys.stderr, flush=True),
                                  skip_emulated=args.quick and not args.include_emulated)
    if args.json == "-":
        return _print_written(crossover.write_map, the_map)
    print("\n".join(crossover.headline_lines(the_map)))
    for tech in the_map.get("skipped_emulated") or []:  # one line each: bf16 and fp16 miss different flags
        why = next(r["why"] for r in the_map["rows"] if r["technique"] == tech and "skipped: " in (r["why"] or ""))
        print(f"not timed: {why.split('skipped: ', 1)[-1]}")
    if out is not None:
        print(f"wrote {crossover.write_map(the_map, out)}")
    return 0


def _threads_study(args: argparse.Namespace, workloads: list[str], techniques: list[str]) -> int:
    """``--threads-study``: check everything before any work (a bad value is one line and exit 2), run the
    study, print it, write ``--json``."""
    from lab import crossover
    from lab.crossover.threads import FULL_TECHNIQUES, usable_cores

    if args.threads != 1:
        raise UsageError(f"--threads {args.threads}: --threads-study always compares 1 thread with all "
                         f"{usable_cores()} usable cores; drop --threads")
    if args.repeats is not None:
        raise UsageError("--repeats does not apply to --threads-study (its rounds are fixed by --quick)")
    if usable_cores() < 2:
        raise UsageError("--threads-study needs >= 2 usable cores: there is nothing to split on one")
    crossover.check_names(workloads, techniques or list(FULL_TECHNIQUES))
    out = json_file(args)
    study = crossover.threads_study(workloads or None, techniques or None, quick=args.quick,
                                    progress=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json == "-":
        return _print_written(crossover.write_study, study)
    print("\n".join(crossover.summary_lines(study)))
    if out is not None:
        print(f"wrote {crossover.write_study(study, out)}")
    return 0


def _print_written(write: Callable[[Any, Path], Path], obj: Any) -> int:
    """Bare ``--json``: print exactly what ``write(obj, path)`` would put in a file (the strict JSON, figures and
    all), so stdout and ``--json PATH`` never differ."""
    with tempfile.TemporaryDirectory() as tmp:
        print(write(obj, Path(tmp) / "out.json").read_text())
    return 0
