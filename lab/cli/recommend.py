"""``python -m lab recommend``: the one answer for a workload at a size on this machine, the card the dashboard
shows above its tabs (:mod:`lab.doctor.recommendation`): the newest stored ablation that can give a verdict measured it,
``--diagnose`` adds the doctor's prediction (a short profiled run), and ``--out FILE`` writes the pick as a
plain-PyTorch file (:mod:`lab.portable`, as ``python -m lab recipe`` does)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.cli.options import UsageError, json_file, json_flag, store_flags, writable_file, write_json

NAME, HELP = "recommend", "the one recommendation for a workload on this machine (measured, then predicted)"
#: What the card reads unless told otherwise: the dashboard's defaults.
SPEEDS = ("train_speedup", "step_speedup", "infer_speedup")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("recommend")
    g.add_argument("--workload", default="ctr", help="the workload (a built-in name or file.py:NAME / module:NAME; "
                                                     "default: ctr)")
    g.add_argument("--size", default="tiny", help="its size (default: tiny)")
    g.add_argument("--speed", default="train_speedup", choices=SPEEDS,
                   help="the speed the card reads: training end to end (default), the training step, or inference")
    g.add_argument("--budget-pt", type=float, default=1.0, metavar="PT",
                   help="the accuracy a pick may cost, in points (default: 1)")
    g.add_argument("--diagnose", action="store_true",
                   help="profile a baseline and add the doctor's prediction (seconds to a minute)")
    g.add_argument("--threads", type=int, default=1, help="compute threads of the diagnosis (default: 1)")
    g.add_argument("--out", metavar="FILE", default=None,
                   help="write the pick as a plain-PyTorch training script (no lab import) to FILE")
    store_flags(g, "results store the ablations are read from (default: $LAB_RESULTS_DB or results/lab.sqlite)")
    json_flag(g, "the card")


def _check(args: argparse.Namespace) -> None:
    """Every input refused before any work, one line each."""
    from lab.config import SIZES
    from lab.workloads import get_workload

    if args.size not in SIZES:
        raise UsageError(f"--size {args.size!r} is invalid: allowed: {', '.join(SIZES)}")
    if not args.budget_pt >= 0 or args.budget_pt == float("inf"):
        raise UsageError(f"--budget-pt {args.budget_pt} is invalid: allowed: a finite number of points >= 0")
    if args.threads < 1:
        raise UsageError(f"--threads {args.threads} is invalid: allowed: an integer >= 1")
    get_workload(args.workload)  # an unknown name: one line listing the known ones


def main(args: argparse.Namespace) -> int:
    from lab.config import RunConfig
    from lab.doctor import diagnose
    from lab.doctor.recommendation import card_from_store, code_line
    from lab.doctor.stored import keep
    from lab.portable import from_techniques
    from lab.store import ResultStore, default_store_path

    _check(args)
    out = writable_file(args.out, "--out") if args.out else None
    path = json_file(args)
    cfg = RunConfig(workload=args.workload, size=args.size, threads=args.threads)
    diagnosis = None
    if args.diagnose:
        print(f"profiling a baseline of {args.workload}/{args.size} for the doctor's prediction ...", file=sys.stderr)
        diagnosis = diagnose(cfg)
        not_kept = keep(diagnosis, args.store)
        if not_kept:
            print(f"lab: warning: {not_kept}", file=sys.stderr)
    store_path = Path(args.store) if args.store else default_store_path()
    if store_path.exists():
        with ResultStore(store_path, read_only=True) as store:
            card = card_from_store(store, args.workload, args.size, diagnosis, speed=args.speed,
                                   budget_pt=args.budget_pt)
    else:  # nothing measured yet: the card says what to run (or, with --diagnose, what the doctor predicts)
        card = card_from_store(None, args.workload, args.size, diagnosis, speed=args.speed, budget_pt=args.budget_pt)
    if args.json == "-":
        print(json.dumps(card.to_dict(), indent=2, default=str))
    else:
        print("\n".join(card.lines()))
        code = code_line(card, args.workload, args.size)
        if code:
            print(code)
    if path is not None:
        write_json(json.dumps(card.to_dict(), indent=2, default=str), path)
    if out is not None:
        if not card.options:
            raise UsageError("--out: the card names no pick to write (nothing measured here pays beyond noise)")
        recipe = from_techniques(card.options, cfg.with_overrides(threads=None), measured=[card.headline(),
                                 card.holds_at()], command=f"python -m lab recommend --workload {args.workload} "
                                 f"--size {args.size}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(recipe.text)
        print(f"wrote {out}: {recipe.title}; run it: {recipe.how_to_run(out.name)}", file=sys.stderr)
    return 0
