"""``python -m lab run``: train one configuration and measure it; store it and print it (or its JSON).

Every flag is a config field (:func:`lab.config.flags.add_config_fields`); ``--profile`` prints the op-class
breakdown and the Chrome trace's path. ``--memory-budget MB`` first measures the memory family's levers on short
tries and runs the fastest configuration that fits (:mod:`lab.ablation.memory_budget`, docs/memory.md).
"""

from __future__ import annotations

import argparse
import sys

from lab.cli.options import UsageError, config_from_args, json_file, json_flag, write_json
from lab.config.flags import add_config_fields

NAME, HELP = "run", "train one configuration and measure it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_fields(p)
    out = p.add_argument_group("output")
    json_flag(out, "the full result")
    out.add_argument("--store", metavar="PATH", help="results database (default: $LAB_RESULTS_DB or results/)")
    out.add_argument("--no-store", action="store_true", help="do not save the result")
    out.add_argument("--label", help="a tag stored with the run (e.g. an experiment name)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    mem = p.add_argument_group("memory budget")
    mem.add_argument("--memory-budget", metavar="MB", default=None,
                     help="before training, measure the memory levers that keep the batch (accum2/4, "
                          "checkpoint_blocks, adam8bit/4bit, combined) on short tries and run the fastest whose "
                          "peak is <= MB; refused in one line when none fits")
    mem.add_argument("--memory-measure", default="auto", metavar="KIND",
                     help="what the budget holds: step (CPU: a training step's real peak in tensor bytes, "
                          "params + optimizer state + the step's allocation high water), roles (what the step "
                          "keeps: params + grads + optimizer state + saved activations; not what must fit), rss "
                          "(a fresh process's peak RSS), cuda (the allocator's peak); auto: cuda on a GPU, else "
                          "step (default: auto)")
    mem.add_argument("--memory-budget-batch", default="fallback", metavar="MODE",
                     help="fallback: halve the batch only when nothing that keeps it fits; never: keep the batch "
                          "(default: fallback)")


def main(args: argparse.Namespace) -> int:
    from lab.result import format_result, section
    from lab.store import ResultStore
    from lab.train import run

    cfg = config_from_args(args)
    budget_mb = budget_from_flag(args.memory_budget)  # refused now, before any work
    json_out = json_file(args)  # refused now, not after the run
    found = None
    if budget_mb is not None:
        from lab.ablation.memory_budget import BATCH_MODES, chosen_config, fit_budget, format_budget, resolve_measure

        if args.memory_budget_batch not in BATCH_MODES:
            raise UsageError(f"--memory-budget-batch={args.memory_budget_batch} is invalid: allowed: "
                             f"{', '.join(BATCH_MODES)}")
        measure = resolve_measure(cfg, args.memory_measure)
        found = fit_budget(cfg, budget_mb, measure=measure, batch=args.memory_budget_batch,
                           progress=lambda line: print(line, file=sys.stderr, flush=True))
        print(format_budget(found), file=sys.stderr if args.json == "-" else sys.stdout, flush=True)
        cfg = chosen_config(cfg, found)
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
        if found is not None and found["measure"] == "step":  # the chosen run's own step peak, to check the answer
            from lab.memory.roles import counting_step_peak

            with counting_step_peak():
                result = run(cfg, progress=progress, on_error="record")
        else:
            result = run(cfg, progress=progress, on_error="record")
        if bar is not None:
            bar.close()
            bar = None
        if section(result, "distributed").get("rank", 0) != 0:
            return 0 if result.status == "ok" else 1
        if found is not None:
            from lab.ablation.memory_budget import run_peak_mb

            found["run_peak_mb"] = run_peak_mb(result, found["measure"])
            result.details["memory_budget"] = found
        stored = None
        if store is not None:
            store.add(result, label=args.label)
            stored = store.path
    finally:
        if bar is not None:  # interrupted or failed mid-training: clear the bar before the one-line message
            bar.close()
        if store is not None:
            store.close()
    if args.json == "-":
        print(result.to_json())
    else:
        print(format_result(result, stored_at=stored))
        prof = result.details.get("profile", {})
        if "train" in prof:  # --profile: the op-class breakdown and where the trace is
            from lab.doctor import format_breakdown
            from lab.measure.profile import Breakdown

            title = "  profiled training step" + (" (compiled)" if prof.get("compiled") else "")
            print(format_breakdown(Breakdown.from_dict(prof["train"]), title))
            top = prof["train"].get("top_ops") or []
            if top:  # a compiled step's costliest entries are Inductor's kernels, named after the ops they fused
                print("  costliest ops (ms per step, under the profiler): "
                      + "; ".join(f"{_short(op)} [{cls}] {ms:.2f}" for op, cls, ms in top[:3]))
            print(f"  trace (open in https://ui.perfetto.dev): {prof.get('trace')}")
    if found is not None and args.json != "-":
        got = found["run_peak_mb"]
        print(f"  memory budget {budget_mb:g} MB: the run's own peak {'n/a' if got is None else f'{got:.4g} MB'} "
              f"({found['measure']}), configuration {found['chosen']['name']}")
    if json_out is not None:
        write_json(result.to_json(), json_out)
    return 0 if result.status == "ok" else 1


def budget_from_flag(text: str | None) -> float | None:
    """``--memory-budget MB`` as a number > 0 (``None`` when not given); anything else is one line, exit 2."""
    if text is None:
        return None
    try:
        mb = float(text)
    except ValueError:
        mb = float("nan")
    if not (mb > 0 and mb != float("inf")):
        raise UsageError(f"--memory-budget={text} is invalid: allowed: a number of MB > 0 (e.g. --memory-budget 512)")
    return mb


def _short(name: str, width: int = 70) -> str:
    """An op name cut to ``width`` characters (Inductor's kernel names list every op they fused)."""
    return name if len(name) <= width else name[:width - 3] + "..."
