"""Command line: ``python -m lab run | runs | export | ablate | bench | crossover | doctor | machine``.

The ``run`` flags mirror :class:`lab.config.RunConfig`: a top-level field ``batch_size`` is
``--batch-size``, a family field ``data.num_workers`` is ``--data-num-workers``, and the common ones have
short aliases (``--precision``, ``--loader``, ``--num-workers``, ``--prune``, ``--quant``, ``--world-size``).
Flags are generated from the dataclasses, so a new config field is a new flag with no CLI change, and a
field whose values live in a registry (``data.loader``, ``data.storage``) offers that registry's names.
``ablate`` runs a recipe or a technique stack through :func:`lab.ablation.run_ablation` with a progress
bar, stores every run (re-running resumes) and prints the table and the best arm under an accuracy budget.
Every user error is one line on stderr and exit status 2, never a traceback; Ctrl-C is exit 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from lab.cli.options import UsageError, _store_flags, _writable_file
from lab.config import FAMILIES, SIZES, RunConfig
from lab.config.flags import add_config_fields
from lab.distributed.launch import RankFailure
from lab.measure import machine
from lab.recipes import RECIPES, TECHNIQUES

ABLATE_TABLE_COLUMNS = ["arm", "status", "n_ok", "train_speedup", "train_speedup_lo", "train_speedup_hi",
                        "infer_speedup", "acc_loss_pt", "noise_pt", "within_noise", "size_ratio", "why"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m lab", description="Training-efficiency lab")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run_p = sub.add_parser("run", help="train one configuration and measure it")
    add_config_fields(run_p)
    out = run_p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the full result as JSON")
    out.add_argument("--store", metavar="PATH", help="results database (default: $LAB_RESULTS_DB or results/)")
    out.add_argument("--no-store", action="store_true", help="do not save the result")
    out.add_argument("--label", help="a tag stored with the run (e.g. an experiment name)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")

    runs_p = sub.add_parser("runs", help="list stored runs")
    runs_p.add_argument("--store", metavar="PATH")
    runs_p.add_argument("--workload")
    runs_p.add_argument("--label")
    runs_p.add_argument("--limit", type=int, default=20)

    exp_p = sub.add_parser("export", help="export stored runs as CSV")
    exp_p.add_argument("--store", metavar="PATH")
    exp_p.add_argument("--out", metavar="CSV", required=True)

    abl = sub.add_parser("ablate", help="run an ablation recipe or technique stack and print its table")
    abl.add_argument("--recipe", default="stacked", help=f"one of: {', '.join(RECIPES)}")
    abl.add_argument("--techniques", default="",
                     help=f"comma-separated stack instead of a recipe: {', '.join(TECHNIQUES)}")
    abl.add_argument("--factorial", action="store_true", help="with --techniques: every subset (interactions)")
    abl.add_argument("--workload", default="ctr")
    abl.add_argument("--size", default="tiny", choices=SIZES)
    abl.add_argument("--repeats", type=int, default=3)
    abl.add_argument("--seeds", type=int, default=1, help="number of seeds (0..N-1)")
    abl.add_argument("--threads", type=int, default=1)
    abl.add_argument("--budget-pt", type=float, default=1.0)
    _store_flags(abl, "results store (default: $LAB_RESULTS_DB or results/lab.sqlite)")
    abl.add_argument("--csv", default=None, help="also write the table here")

    bench_p = sub.add_parser("bench", help="run benchmarks/*.py and write their JSON")
    bench_p.add_argument("--quick", action="store_true", help="each benchmark's short setting")
    bench_p.add_argument("--only", help="comma-separated benchmark names (default: all)")
    bench_p.add_argument("--out", metavar="DIR",
                         help="default: benchmarks/results/<hardware-id>/ (<hardware-id>-quick/ with --quick)")
    bench_p.add_argument("--report-only", action="store_true",
                         help="run nothing: re-render report.json / report.md from the JSON already in --out")
    bench_p.add_argument("--update-readme", action="store_true",
                         help="also rewrite README.md's results table from every benchmarks/results/*/report.json")
    doc = sub.add_parser("doctor", help="profile a baseline, predict which technique pays here, optionally verify")
    add_config_fields(doc)
    dg = doc.add_argument_group("doctor")
    dg.add_argument("--verify", type=int, default=0, metavar="K",
                    help="measure the top K predictions and the baseline in an interleaved ablation")
    dg.add_argument("--repeats", type=int, default=3, help="repeats per arm when verifying")
    dg.add_argument("--techniques", default="", help=f"comma-separated subset of: {', '.join(TECHNIQUES)}")
    _store_flags(dg, "results store for the verification runs")
    dg.add_argument("--json", action="store_true", help="print the diagnosis (and verification) as JSON")
    cross = sub.add_parser("crossover", help="map each technique's speedup against model size (the ladders)")
    cross.add_argument("--workloads", default="", help="comma-separated (default: ctr,sequence,vision,transformer,mlp)")
    cross.add_argument("--techniques", default="", help="comma-separated (default: all; --quick: the cheap ones)")
    cross.add_argument("--threads", type=int, default=1, help="torch threads for every arm (default 1)")
    cross.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 5; --quick 4)")
    cross.add_argument("--quick", action="store_true", help="4 rungs per workload, cheap techniques (~2-3 min)")
    cross.add_argument("--json", metavar="PATH", help="write the map here")
    cross.add_argument("--threads-study", action="store_true", help="the map at 1 thread vs all cores, and loader "
                       "workers vs compute threads along the vision ladder (lab.crossover.threads)")
    machine.add_cli_arguments(sub.add_parser("machine", help="this machine's card: ISA, caches, measured GEMM / "
                                             "memory peaks (cached; lab.measure.machine)"))
    return parser


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Build the RunConfig from parsed flags (only flags the user gave override the defaults)."""
    keys = {f.name for f in dataclasses.fields(RunConfig) if f.name not in FAMILIES}
    keys |= {f"{fam}.{f.name}" for fam, cls in FAMILIES.items() for f in dataclasses.fields(cls)}
    overrides = {k: v for k, v in vars(args).items() if k in keys}
    return RunConfig().with_overrides(**overrides)


def _cmd_run(args: argparse.Namespace) -> int:
    from lab.result import format_result
    from lab.store import ResultStore
    from lab.train import run

    cfg = config_from_args(args)
    bar = None
    progress = None
    if not args.no_progress:
        from tqdm import tqdm

        def progress(event: dict) -> None:
            nonlocal bar
            if event["phase"] == "train":
                if bar is None:
                    bar = tqdm(total=event["total_steps"], desc=f"{cfg.workload}/{cfg.size}", unit="step",
                               file=sys.stderr, leave=False, mininterval=0.5)
                bar.update(1)
                if event["step"] % 20 == 0:
                    bar.set_postfix(epoch=f"{event['epoch'] + 1}/{event['epochs']}", loss=f"{event['loss']:.4f}")
            elif event["phase"] == "eval" and bar is not None:
                bar.close()

    from lab.distributed import detect_launch

    # Opened before training: a store that cannot be written is an error now, not after the run is done.
    # Under torchrun / srun rank 0 alone reports and stores.
    store = None if args.no_store or detect_launch().rank != 0 else ResultStore(args.store)
    try:
        result = run(cfg, progress=progress, on_error="record")
        if bar is not None:
            bar.close()
            bar = None
        if result.details.get("ddp", {}).get("rank", 0) != 0:
            return 0 if result.status == "ok" else 1
        stored = None
        if store is not None:
            store.add(result, label=args.label)
            stored = store.path
    finally:
        if bar is not None:  # interrupted or failed mid-training: clear the bar before the one-line message
            bar.close()
        if store is not None:
            store.close()
    if args.json:
        print(result.to_json())
    else:
        print(format_result(result, stored_at=stored))
        prof = result.details.get("profile", {})
        if "train" in prof:  # --profile: the op-class breakdown and where the trace is
            from lab.doctor import format_breakdown
            from lab.measure.profile import Breakdown

            print(format_breakdown(Breakdown.from_dict(prof["train"]), "  profiled training step"))
            print(f"  trace (open in https://ui.perfetto.dev): {prof.get('trace')}")
    return 0 if result.status == "ok" else 1


def _cmd_runs(args: argparse.Namespace) -> int:
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


def _cmd_export(args: argparse.Namespace) -> int:
    from lab.store import ResultStore

    with ResultStore(args.store, read_only=True) as store:  # a missing database is an error, not a new one
        path = store.export_csv(args.out)
        print(f"wrote {store.count()} runs to {path}")
    return 0


def _cmd_ablate(args: argparse.Namespace) -> int:
    import pandas as pd
    from tqdm import tqdm

    from lab.ablation import interaction_effects, run_ablation, verdict
    from lab.precision import not_applicable_reason
    from lab.recipes import factorial, from_techniques, get_recipe
    from lab.store import ResultStore

    base = RunConfig(workload=args.workload, size=args.size, threads=args.threads or None)
    techs = [t.strip() for t in args.techniques.split(",") if t.strip()]
    if techs:
        ablation = factorial(base, techs) if args.factorial else from_techniques("custom", base, [techs])
    else:
        ablation = get_recipe(args.recipe)(base)
    if args.seeds < 1:
        raise UsageError(f"seeds={args.seeds} is invalid: allowed: >= 1")
    if args.repeats < 1:
        raise UsageError(f"repeats={args.repeats} is invalid: allowed: >= 1")
    if not 0 <= args.budget_pt < float("inf"):  # also refuses nan
        raise UsageError(f"budget-pt={args.budget_pt} is invalid: allowed: a finite number >= 0")
    if args.csv:
        _writable_file(args.csv, "--csv")  # checked now, not after the ablation has run
    with ResultStore(args.store) as store, tqdm(total=len(ablation.arms) * args.repeats * args.seeds,
                                              unit="run", file=sys.stderr) as bar:
        def progress(event: dict) -> None:
            if event["phase"] == "ablation":
                bar.set_postfix_str(f"{event['arm']} ({'stored' if event['skipped'] else event['status']})")
                bar.update(1)

        df = run_ablation(ablation, repeats=args.repeats, seeds=list(range(args.seeds)), store=store,
                          progress=progress)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 40):
        table = df[ABLATE_TABLE_COLUMNS].round(3)
        table["why"] = table["why"].fillna("").str.slice(0, 50)
        print(table.to_string(index=False))
        effects = interaction_effects(df)
        if not effects.empty and (effects["term"] != "main").any():
            print("\nfactorial effects (training speedup):\n" + effects.round(3).to_string(index=False))
    print("\n(blank speedup: the arm's techniques cannot change that axis, e.g. post-training int8 on training; "
          "blank interval: fewer than 3 runs)")
    for speed in ("train_speedup", "infer_speedup"):
        print(f"verdict ({speed.split('_')[0]}, within {args.budget_pt:g}): "
              + verdict(df, args.budget_pt, speed)["text"])
    for arm, err in zip(df["arm"], df["error"], strict=True):
        if not_applicable_reason(err):
            print(f"{arm}: does not apply here (refused before training): {not_applicable_reason(err)}")
    _print_versus(df, base)
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.csv, index=False)
    return 0


def _print_versus(df: Any, base: RunConfig) -> None:
    """Issue 15: this machine's crossover map's prediction per arm beside what the ablation measured."""
    from lab.crossover.versus import versus_lines
    from lab.doctor.rates import crossover_path
    from lab.measure import environment_stamp

    path = Path(os.environ.get("LAB_CROSSOVER_JSON") or crossover_path(environment_stamp()["hardware_id"]))
    print("\n".join(versus_lines(df, base.workload_spec or base.workload, path, size=base.size,
                                 model_scale=base.model_scale)))


def _cmd_bench(args: argparse.Namespace) -> int:
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
        readme = bench.BENCH_DIR.parent / "README.md"
        done = bench.update_readme(readme, bench.BENCH_DIR / "results")
        print(f"README table {'updated' if done else 'NOT updated (README has no report markers)'}")
        from lab.crossover.report import write_cross_hardware

        done = write_cross_hardware(readme, bench.BENCH_DIR / "results")
        print(f"cross-hardware table {'updated' if done else 'NOT updated (README has no cross-hardware markers)'}")
    return 1 if failed else 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    import json

    from lab.doctor import diagnose, format_diagnosis, format_verification, verify
    from lab.store import ResultStore

    if args.verify < 0:
        raise UsageError(f"--verify {args.verify} is invalid: allowed: >= 0 (0: predict only)")
    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats} is invalid: allowed: >= 1")
    cfg = config_from_args(args)
    if "threads" not in vars(args):  # a fixed thread count for A/B timings (docs/architecture.md 5.8)
        cfg = cfg.with_overrides(threads=1)
    techs = [t.strip() for t in args.techniques.split(",") if t.strip()] or None
    d = diagnose(cfg, techniques=techs)
    out: dict[str, Any] = d.to_dict()
    if not args.json:
        print(format_diagnosis(d))
    if args.verify:
        with ResultStore(args.store) as store:
            rows = verify(d, args.verify, repeats=args.repeats, store=store)
        out["verification"] = rows
        if not args.json:
            print("\nverification (interleaved ablation, " + f"{args.repeats} repeats per arm):")
            print(format_verification(rows))
    if args.json:
        print(json.dumps(out, default=str))
    return 0


def _cmd_crossover(args: argparse.Namespace) -> int:
    from lab import crossover

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    techniques = [t.strip() for t in args.techniques.split(",") if t.strip()]
    if args.threads_study:
        return crossover.threads_cli(args, workloads, techniques, lambda p: _writable_file(p, "--json"))
    workloads = workloads or list(crossover.MAP_WORKLOADS)
    techniques = techniques or list(crossover.QUICK_TECHNIQUES if args.quick else crossover.TECHNIQUES)
    crossover.check_names(workloads, techniques)
    RunConfig(threads=args.threads)  # the same threads check as a run: one line, before any work
    if args.repeats is not None and args.repeats < 3:
        raise UsageError(f"--repeats {args.repeats}: need >= 3 rounds for a confidence interval")
    out = _writable_file(args.json, "--json") if args.json else None
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731 - progress to stderr
    machine.machine_card(quick=args.quick, progress=say)  # cached after the first: the map cites its peaks
    the_map = crossover.build_map(workloads, techniques, quick=args.quick, threads=args.threads,
                                  repeats=args.repeats, progress=lambda m: print(m, file=sys.stderr, flush=True))
    print("\n".join(crossover.headline_lines(the_map)))
    if out is not None:
        print(f"wrote {crossover.write_map(the_map, out)}")
    return 0


COMMANDS = {"run": _cmd_run, "runs": _cmd_runs, "export": _cmd_export, "ablate": _cmd_ablate, "bench": _cmd_bench,
            "doctor": _cmd_doctor, "crossover": _cmd_crossover, "machine": machine.cli}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 a run failed, 2 a usage or configuration error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
        if args.command in ("run", "ablate", "doctor"):
            from lab.workloads import list_workloads

            list_workloads()  # loads LAB_WORKLOADS now: a broken entry is one line, even for a built-in run
        return COMMANDS[args.command](args)
    except SystemExit as exc:  # argparse's --help
        return int(exc.code or 0)
    except (UsageError, ValueError) as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 2
    except RankFailure as exc:  # a data-parallel rank died, hung or raised: the job failed, one line names it
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
