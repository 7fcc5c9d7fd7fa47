"""Command line: ``python -m lab run | runs | export | bench``.

The ``run`` flags mirror :class:`lab.config.RunConfig`: a top-level field ``batch_size`` is
``--batch-size``, a family field ``data.num_workers`` is ``--data-num-workers``, and the common ones have
short aliases (``--precision``, ``--loader``, ``--num-workers``, ``--prune``, ``--quant``, ``--world-size``).
Flags are generated from the dataclasses, so a new config field is a new flag with no CLI change.
Every user error is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lab.config import FAMILIES, RunConfig

ALIASES = {
    "precision.dtype": "--precision", "data.loader": "--loader", "data.num_workers": "--num-workers",
    "data.prefetch_factor": "--prefetch-factor", "data.pin_memory": "--pin-memory",
    "prune.method": "--prune", "prune.amount": "--prune-amount", "quant.method": "--quant",
    "ddp.world_size": "--world-size",
}


class UsageError(Exception):
    """A user mistake on the command line: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        raise UsageError(message)


def _converter(annotation: str, key: str):
    optional = "None" in annotation
    if annotation.startswith("tuple"):
        return lambda s: tuple(x.strip() for x in s.split(",") if x.strip())

    base = int if annotation.startswith("int") else float if annotation.startswith("float") else str

    def convert(text: str) -> Any:
        if optional and text.lower() == "none":
            return None
        try:
            return base(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {base.__name__}, got {text!r}") from None

    convert.__name__ = base.__name__  # argparse names the type in its error message
    return convert


def _add_field(group: argparse._ArgumentGroup, key: str, f: dataclasses.Field) -> None:
    flags = ["--" + key.replace(".", "-").replace("_", "-")]
    if key in ALIASES:
        flags.insert(0, ALIASES[key])
    ann = str(f.type)
    kwargs: dict[str, Any] = {"dest": key, "default": argparse.SUPPRESS}
    if ann == "bool":
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = _converter(ann, key)
        kwargs["metavar"] = key.split(".")[-1].upper()
    group.add_argument(*flags, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m lab", description="Training-efficiency lab")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run_p = sub.add_parser("run", help="train one configuration and measure it")
    core = run_p.add_argument_group("run")
    for f in dataclasses.fields(RunConfig):
        if f.name not in FAMILIES:
            _add_field(core, f.name, f)
    for fam, cls in FAMILIES.items():
        group = run_p.add_argument_group(fam)
        for f in dataclasses.fields(cls):
            _add_field(group, f"{fam}.{f.name}", f)
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

    # Parsed by lab.ablate_cli (main() hands it the rest of the line); listed here for --help.
    sub.add_parser("ablate", help="run an ablation recipe or technique stack (python -m lab ablate --help)",
                   add_help=False)

    bench_p = sub.add_parser("bench", help="run benchmarks/*.py and write their JSON")
    bench_p.add_argument("--quick", action="store_true", help="each benchmark's short setting")
    bench_p.add_argument("--only", help="comma-separated benchmark names (default: all)")
    bench_p.add_argument("--out", metavar="DIR",
                         help="default: benchmarks/results/<hardware-id>/ (<hardware-id>-quick/ with --quick)")
    bench_p.add_argument("--report-only", action="store_true",
                         help="run nothing: re-render report.json / report.md from the JSON already in --out")
    bench_p.add_argument("--update-readme", action="store_true",
                         help="also rewrite README.md's results table from every benchmarks/results/*/report.json")
    return parser


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Build the RunConfig from parsed flags (only flags the user gave override the defaults)."""
    keys = {f.name for f in dataclasses.fields(RunConfig) if f.name not in FAMILIES}
    keys |= {f"{fam}.{f.name}" for fam, cls in FAMILIES.items() for f in dataclasses.fields(cls)}
    overrides = {k: v for k, v in vars(args).items() if k in keys}
    return RunConfig().with_overrides(**overrides)


def _cmd_run(args: argparse.Namespace) -> int:
    from lab.report import format_result
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

    result = run(cfg, progress=progress, on_error="record")
    if bar is not None:
        bar.close()
    if result.details.get("ddp", {}).get("rank", 0) != 0:  # under torchrun/srun rank 0 alone reports and stores
        return 0 if result.status == "ok" else 1
    stored = None
    if not args.no_store:
        with ResultStore(args.store) as store:
            store.add(result, label=args.label)
            stored = store.path
    if args.json:
        print(result.to_json())
    else:
        print(format_result(result, stored_at=stored))
    return 0 if result.status == "ok" else 1


def _cmd_runs(args: argparse.Namespace) -> int:
    from lab.store import ResultStore

    with ResultStore(args.store) as store:
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

    with ResultStore(args.store) as store:
        path = store.export_csv(args.out)
        print(f"wrote {store.count()} runs to {path}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from lab.measure import environment_stamp

    bench_dir = Path(__file__).resolve().parent.parent / "benchmarks"
    scripts = sorted(p for p in bench_dir.glob("*.py") if not p.name.startswith("_"))
    if not scripts:
        raise UsageError(f"no benchmarks found in {bench_dir} (run from a source checkout)")
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        unknown = wanted - {p.stem for p in scripts}
        if unknown:
            raise UsageError(f"unknown benchmark(s): {', '.join(sorted(unknown))}; "
                             f"available: {', '.join(p.stem for p in scripts)}")
        scripts = [p for p in scripts if p.stem in wanted]
    # Quick and full results live apart, so a quick check never overwrites a full report (and each mode's
    # second run is compared with its own first).
    default_name = environment_stamp()["hardware_id"] + ("-quick" if args.quick else "")
    out_dir = Path(args.out) if args.out else bench_dir / "results" / default_name
    if args.report_only and not out_dir.is_dir():
        raise UsageError(f"--report-only: {out_dir} does not exist (run `python -m lab bench` first)")
    out_dir.mkdir(parents=True, exist_ok=True)
    failed, times = [], {}
    for script in [] if args.report_only else scripts:
        cmd = [sys.executable, str(script), "--json", str(out_dir / f"{script.stem}.json")]
        if args.quick:
            cmd.append("--quick")
        print(f"== {script.stem}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        if subprocess.run(cmd).returncode != 0:
            failed.append(script.stem)
        times[script.stem] = time.perf_counter() - t0
    if times:
        print("wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
              + f"; total {sum(times.values()):.0f} s")
    from lab.bench_report import update_readme, write_report

    try:
        _, md_path, report = write_report(out_dir, new_results=not args.report_only)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    flagged = [r["name"] for r in report["rows"] if r.get("within_ci") is False]
    print(f"results in {out_dir}; report {md_path}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    if flagged:
        print(f"not reproduced within the previous run's CI ({len(flagged)}): " + "; ".join(flagged))
    if args.update_readme:
        readme = bench_dir.parent / "README.md"
        done = update_readme(readme, bench_dir / "results")
        print(f"README table {'updated' if done else 'NOT updated (README has no report markers)'}")
    return 1 if failed else 0


COMMANDS = {"run": _cmd_run, "runs": _cmd_runs, "export": _cmd_export, "bench": _cmd_bench}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 a run failed, 2 a usage or configuration error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["ablate"]:
        from lab.ablate_cli import main as ablate_main

        try:
            return ablate_main(argv[1:])
        except SystemExit as exc:  # argparse's --help / usage errors inside the sub-CLI
            return int(exc.code or 0)
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, ValueError, NotImplementedError) as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
