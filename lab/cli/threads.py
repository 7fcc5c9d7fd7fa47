"""``python -m lab threads``: the threads study (:mod:`lab.crossover.threads_study`): the crossover map at 1 thread
against all cores (what the other cores buy the fp32 step, which technique verdicts flip), then loader workers
against compute threads along the vision ladder (where giving a core to a DataLoader worker stops paying).

A subcommand of its own because it shares only ``--workloads``, ``--techniques``, ``--quick`` and ``--json`` with
``crossover``: the thread counts and the rounds are the study's, so it has no ``--threads`` or ``--repeats``.
``crossover --threads-study`` is its deprecated alias (one warning line, then :func:`main`)."""

from __future__ import annotations

import argparse
import sys

from lab.cli.options import UsageError, json_file, json_flag, print_written

NAME, HELP = "threads", "the crossover map at 1 thread vs all cores, and loader workers vs compute threads"


def add_arguments(p: argparse.ArgumentParser) -> None:
    # The defaults are lab.crossover.threads' QUICK_/FULL_ constants, spelled out so --help imports no torch.
    p.add_argument("--workloads", default="", help="comma-separated workloads of the map half (default: sequence,"
                   "vision,transformer; --quick: transformer); the ladder half is always vision")
    p.add_argument("--techniques", default="", help="comma-separated (default: bf16,int8_eager,prune_channels50,"
                   "fused_optim; --quick: bf16,int8_eager,fused_optim)")
    p.add_argument("--quick", action="store_true", help="2 map rungs per workload, the cheap techniques, 3 ladder "
                   "rungs of 3 rounds (~5 min on 2 cores)")
    json_flag(p, "the study")


def main(args: argparse.Namespace) -> int:
    """Check everything before any work (a bad value is one line and exit 2), run the study, print it, write
    ``--json``. ``args`` needs only this parser's four flags (``crossover --threads-study`` passes its own)."""
    from lab import crossover
    from lab.crossover.threads import FULL_TECHNIQUES, usable_cores

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    techniques = [t.strip() for t in args.techniques.split(",") if t.strip()]
    if usable_cores() < 2:
        raise UsageError("the threads study needs >= 2 usable cores: there is nothing to split on one")
    crossover.check_names(workloads, techniques or list(FULL_TECHNIQUES))
    out = json_file(args)
    study = crossover.threads_study(workloads or None, techniques or None, quick=args.quick,
                                    progress=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json == "-":
        return print_written(crossover.write_study, study)
    print("\n".join(crossover.summary_lines(study)))
    if out is not None:
        print(f"wrote {crossover.write_study(study, out)}")
    return 0
