"""``python -m lab crossover``: map each technique's speedup against model size along the ladders (the machine
card first: the map cites its peaks). The map at 1 thread against all cores is ``python -m lab threads``
(:mod:`lab.cli.threads`); ``--threads-study`` here is its deprecated alias."""

from __future__ import annotations

import argparse
import sys

from lab.cli import threads
from lab.cli.options import UsageError, json_file, json_flag, print_written
from lab.config import RunConfig
from lab.measure import machine

NAME, HELP = "crossover", "map each technique's speedup against model size (the ladders)"


class _DeprecatedThreadsStudy(argparse.Action):
    """``--threads-study`` (the threads study's old spelling): still accepted for one release, with a warning; the
    study is ``python -m lab threads``."""

    def __init__(self, option_strings, dest, **kwargs) -> None:  # noqa: ANN001 - argparse's API
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001 - argparse's API
        print(f"lab: warning: crossover {option_string} is deprecated; use python -m lab threads", file=sys.stderr)
        setattr(namespace, self.dest, True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", default="", help="comma-separated (default: ctr,sequence,vision,transformer,mlp)")
    p.add_argument("--techniques", default="", help="comma-separated (default: all; --quick: the cheap ones)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for every arm (default 1)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 5; --quick 4)")
    p.add_argument("--quick", action="store_true", help="4 rungs per workload, cheap techniques (~2-3 min)")
    p.add_argument("--include-emulated", action="store_true",
                   help="--quick: also time bf16 / fp16 where this CPU runs them emulated (skipped by default: "
                   "a reference path that cannot pay, and most of the quick map's time on an AVX2 CPU)")
    json_flag(p, "the map")
    p.add_argument("--threads-study", action=_DeprecatedThreadsStudy, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    from lab import crossover

    if args.threads_study:
        return _threads_study(args)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    techniques = [t.strip() for t in args.techniques.split(",") if t.strip()]
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
        return print_written(crossover.write_map, the_map)
    print("\n".join(crossover.headline_lines(the_map)))
    for tech in the_map.get("skipped_emulated") or []:  # one line each: bf16 and fp16 miss different flags
        why = next(r["why"] for r in the_map["rows"] if r["technique"] == tech and "skipped: " in (r["why"] or ""))
        print(f"not timed: {why.split('skipped: ', 1)[-1]}")
    if out is not None:
        print(f"wrote {crossover.write_map(the_map, out)}")
    return 0


def _threads_study(args: argparse.Namespace) -> int:
    """The deprecated ``--threads-study``: ``python -m lab threads`` with this parser's flags; the map's flags that
    the study has no use for are refused (one line, exit 2) rather than ignored."""
    if args.threads != 1:
        raise UsageError(f"--threads {args.threads}: the threads study always compares 1 thread with all usable "
                         "cores; drop --threads")
    if args.repeats is not None:
        raise UsageError("--repeats does not apply to the threads study (its rounds are fixed by --quick)")
    if args.include_emulated:
        raise UsageError("--include-emulated does not apply to the threads study (its quick maps skip emulated "
                         "bf16 / fp16)")
    return threads.main(args)
