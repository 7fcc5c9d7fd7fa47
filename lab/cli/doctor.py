"""``python -m lab doctor``: profile a baseline, predict which technique pays here, optionally verify the top
predictions in an interleaved ablation. The configuration flags are the config's own."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lab.cli.options import UsageError, config_from_args, json_file, json_flag, store_flags, write_json
from lab.config.flags import add_config_fields
from lab.registry import OPTIONS

NAME, HELP = "doctor", "profile a baseline, predict which technique pays here, optionally verify"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_fields(p)
    dg = p.add_argument_group("doctor")
    dg.add_argument("--verify", type=int, default=0, metavar="K",
                    help="measure the top K predictions and the baseline in an interleaved ablation")
    dg.add_argument("--repeats", type=int, default=3, help="repeats per arm when verifying (default: 3)")
    dg.add_argument("--measure", default="", metavar="compile",
                    help="time these on the model itself (seconds to a minute each): compile")
    dg.add_argument("--techniques", default="", help=f"comma-separated subset of: {', '.join(OPTIONS)}")
    dg.add_argument("--full-epochs", type=int, default=None, metavar="E",
                    help="the prescription in hours: the full run's epochs (default: the run's own when --rows is "
                         "given; with neither, per 1000 steps)")
    dg.add_argument("--rows", type=int, default=None, metavar="N", help="the full run's training rows")
    dg.add_argument("--memory-budget", metavar="MB", default=None,
                    help="prescribe first the fastest measured memory lever (accum2/4, checkpoint_blocks, "
                         "adam8bit/4bit, combined) whose peak is <= MB, with its time cost; or say nothing fits")
    store_flags(dg, "results store for the verification runs")
    json_flag(dg, "the diagnosis (and verification)")


def main(args: argparse.Namespace) -> int:
    import json

    from lab.doctor import diagnose, format_diagnosis, format_scorecard, format_verification, scorecard, verify
    from lab.doctor.hours import format_hours, prescription_hours
    from lab.doctor.stored import keep
    from lab.store import ResultStore

    if args.verify < 0:
        raise UsageError(f"--verify {args.verify} is invalid: allowed: >= 0 (0: predict only)")
    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats} is invalid: allowed: >= 1")
    for flag, v in (("--full-epochs", args.full_epochs), ("--rows", args.rows)):
        if v is not None and v < 1:
            raise UsageError(f"{flag} {v} is invalid: allowed: >= 1")
    from lab.cli.run import budget_from_flag

    budget_mb = budget_from_flag(args.memory_budget)  # refused now, before any work
    cfg = config_from_args(args)
    json_out = json_file(args)  # refused now, not after the diagnosis
    if "threads" not in vars(args):  # a fixed thread count for A/B timings (docs/architecture.md 5.8)
        cfg = cfg.with_overrides(threads=1)
    memory, memory_text = None, None
    if budget_mb is not None:  # memory first: a step that does not fit never runs
        from lab.doctor.memory import format_memory_prescription, memory_prescription

        memory = memory_prescription(cfg, budget_mb, progress=lambda line: print(line, file=sys.stderr, flush=True))
        memory_text = format_memory_prescription(memory)
    techs = [t.strip() for t in args.techniques.split(",") if t.strip()] or None
    measure = [m.strip() for m in args.measure.split(",") if m.strip()]
    d = diagnose(cfg, techniques=techs, measure=measure)
    not_kept = keep(d, args.store)  # the recommendation card (lab recommend, the dashboard) reads it later
    if not_kept:
        print(f"lab: warning: {not_kept}", file=sys.stderr)
    try:
        h = prescription_hours(d, epochs=args.full_epochs, rows=args.rows)
        if args.full_epochs is not None or args.rows is not None:  # one-off costs over the user's run, not this one
            d = d.for_run(h["steps"], "the full run")
            h = prescription_hours(d, epochs=args.full_epochs, rows=args.rows)
        hours = format_hours(h)
    except ValueError as exc:  # a baseline the projection cannot read: said, not hidden
        h, hours = None, f"full run not projected: {exc}"
    out: dict[str, Any] = d.to_dict()
    if memory is not None:
        out["memory_budget"] = memory
    if h is not None:
        out["hours"] = h
    text = args.json != "-"
    if text:
        print(format_diagnosis(d, memory=memory_text))
        print(hours)
    if args.verify:
        with ResultStore(args.store) as store:
            rows = verify(d, args.verify, repeats=args.repeats, store=store)
        out["verification"] = rows
        if text:
            print("\nverification (interleaved ablation, " + f"{args.repeats} repeats per arm):")
            print(format_verification(rows))
            print(format_scorecard(scorecard([{"rows": rows}]), "this verification"))
    if not text:
        print(json.dumps(out, default=str))
    elif json_out is not None:
        write_json(json.dumps(out, default=str), json_out)
    return 0
