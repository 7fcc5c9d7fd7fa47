"""``python -m lab ablate``: a recipe or a technique stack through :func:`lab.ablation.run_ablation` with a
progress bar; every run is stored (re-running resumes) and the table, the verdict under an accuracy budget and
the crossover map's prediction per arm are printed. The base configuration's flags are the config's own
(:func:`lab.config.flags.add_config_fields`), with an ablation's defaults (:data:`ABLATE_DEFAULTS`).
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path
from typing import Any

from lab.cli.options import UsageError, config_from_args, store_flags, writable_file
from lab.config import RunConfig
from lab.config.flags import add_config_fields
from lab.recipes import RECIPES  # the module that fills the registry: its names in --help
from lab.registry import OPTIONS

NAME, HELP = "ablate", "run an ablation recipe or technique stack and print its table"
#: The base an ablation starts from unless a flag says otherwise: small enough to answer in minutes, one
#: thread so the arms' timings do not fight over cores.
ABLATE_DEFAULTS = {"workload": "ctr", "size": "tiny", "threads": 1}
ABLATE_TABLE_COLUMNS = ["arm", "status", "n_ok", "train_speedup", "train_speedup_lo", "train_speedup_hi",
                        "infer_speedup", "acc_loss_pt", "noise_pt", "within_noise", "size", "of_ceiling", "why"]
#: Time to target, shown when the runs evaluated during training (``--eval-every`` / ``--target-metric``).
TTT_TABLE_COLUMNS = ["arm", "one_off_s", "end_to_end_s", "ttt_s", "ttt_speedup", "ttt_speedup_lo", "ttt_speedup_hi",
                     "ttt_reached", "peak_memory_mb"]


def _of_ceiling(arm: Any) -> str:
    """``"80 % of 1.82x"``: the arm's measured speedup as a share of its ceiling on this machine (blank: none)."""
    if arm.share_of_ceiling is None or arm.ceiling is None:
        return ""
    return f"{100 * arm.share_of_ceiling:.0f} % of {arm.ceiling:.3g}x"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_fields(p)
    g = p.add_argument_group("ablation")
    g.add_argument("--recipe", default="stacked", help=f"the arms: one of {', '.join(RECIPES)} (default: stacked)")
    g.add_argument("--techniques", default="",
                   help=f"comma-separated stack instead of a recipe: {', '.join(OPTIONS)}")
    g.add_argument("--factorial", action="store_true", help="with --techniques: every subset (interactions)")
    g.add_argument("--repeats", type=int, default=3, help="runs per arm and seed, interleaved (default: 3)")
    g.add_argument("--seeds", type=int, default=1, help="number of seeds, 0..N-1 (default: 1)")
    g.add_argument("--budget-pt", type=float, default=1.0,
                   help="accuracy budget of the verdict: metric points an arm may lose against the baseline "
                        "(default: 1.0)")
    store_flags(g, "results store (default: $LAB_RESULTS_DB or results/lab.sqlite)")
    g.add_argument("--csv", default=None, help="also write the table here")
    g.add_argument("--include-emulated", action="store_true",
                   help="run the recipe's bf16 / fp16 arms even where this CPU emulates them (skipped by default: "
                        "they cannot pay and run at a fraction of fp32)")
    g.add_argument("--no-estimate", action="store_true",
                   help="start at once, without the probe run per arm that estimates the ablation's time")


def main(args: argparse.Namespace) -> int:
    import pandas as pd
    from tqdm import tqdm

    from lab.ablation import interaction_effects, run_ablation, verdict
    from lab.precision import not_applicable_reason
    from lab.recipes import factorial, from_techniques, get_recipe
    from lab.store import ResultStore

    base = config_from_args(args, defaults=ABLATE_DEFAULTS)
    techs = [t.strip() for t in args.techniques.split(",") if t.strip()]
    if techs:
        ablation = factorial(base, techs) if args.factorial else from_techniques("custom", base, [techs])
    else:
        recipe = get_recipe(args.recipe)
        if args.include_emulated and "include_emulated" not in inspect.signature(recipe).parameters:
            raise UsageError(f"--include-emulated: recipe {args.recipe!r} does not skip emulated arms")
        ablation = recipe(base, include_emulated=True) if args.include_emulated else recipe(base)
    if args.seeds < 1:
        raise UsageError(f"seeds={args.seeds} is invalid: allowed: >= 1")
    if args.repeats < 1:
        raise UsageError(f"repeats={args.repeats} is invalid: allowed: >= 1")
    if not 0 <= args.budget_pt < float("inf"):  # also refuses nan
        raise UsageError(f"budget-pt={args.budget_pt} is invalid: allowed: a finite number >= 0")
    if args.csv:
        writable_file(args.csv, "--csv")  # checked now, not after the ablation has run
    for arm, why in ablation.skipped.items():
        print(f"skipped {arm}: {why} (--include-emulated runs it)")
    estimate = None
    if not args.no_estimate:
        from lab.ablation import estimate_ablation, estimate_text

        estimate = estimate_ablation(ablation, repeats=args.repeats, seeds=list(range(args.seeds)))
        print(estimate_text(estimate), flush=True)
    with ResultStore(args.store) as store, tqdm(total=len(ablation.arms) * args.repeats * args.seeds,
                                              unit="run", file=sys.stderr) as bar:
        def progress(event: dict) -> None:
            if event["phase"] == "ablation":
                bar.set_postfix_str(f"{event['arm']} ({'stored' if event['skipped'] else event['status']})")
                bar.update(1)

        df = run_ablation(ablation, repeats=args.repeats, seeds=list(range(args.seeds)), store=store,
                          progress=progress, budget_pt=args.budget_pt, estimate=estimate)
        memory = _memory_lines(ablation, store, args.repeats, list(range(args.seeds)), df)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 40):
        from lab.ablation.record import build_record

        record = build_record(df)  # the size as the dashboard says it: "2.12x smaller" (baseline / arm bytes)
        sized = df.assign(size=[record.arms[a].size.text if record.arms[a].size else "" for a in df["arm"]],
                          why=["; ".join(record.arms[a].why) for a in df["arm"]],  # the page's why, said once
                          of_ceiling=[_of_ceiling(record.arms[a]) for a in df["arm"]])
        table = sized[ABLATE_TABLE_COLUMNS].round(3)
        table["why"] = table["why"].fillna("").str.slice(0, 50)
        print(table.to_string(index=False))
        effects = interaction_effects(df)
        if not effects.empty and (effects["term"] != "main").any():
            print("\nfactorial effects (training speedup):\n" + effects.round(3).to_string(index=False))
    print("\n(blank speedup: the arm's techniques cannot change that axis, e.g. post-training int8 on training; "
          "blank interval: fewer than 3 runs)")
    timed = df["target_metric"].notna().any()
    if timed:
        how = ("--target-metric" if base.target_metric is not None
               else f"the baseline's final metric - {args.budget_pt:g}")
        print(f"\ntime to target {df['metric_name'].dropna().iloc[0]} {df['target_metric'].dropna().iloc[0]:.4g} "
              f"({how}); one-off costs and end to end in s:\n"
              + df[TTT_TABLE_COLUMNS].round(3).to_string(index=False))
    for speed in ("train_speedup", "infer_speedup", *(("ttt_speedup",) if timed else ())):
        print(f"verdict ({speed.split('_')[0]}, within {args.budget_pt:g}): "
              + verdict(df, args.budget_pt, speed)["text"])
    for arm, err in zip(df["arm"], df["error"], strict=True):
        if not_applicable_reason(err):
            print(f"{arm}: does not apply here (refused before training): {not_applicable_reason(err)}")
    if memory:
        print("\n" + memory)
    _print_versus(df, base)
    _print_card(df, base, args.budget_pt)
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.csv, index=False)
    return 0


def _memory_lines(ablation: Any, store: Any, repeats: int, seeds: list[int], table: Any = None) -> str | None:
    """An ablation with memory arms: each arm's measured peak with its step-time cost
    (:func:`lab.ablation.memory_trade.format_memory`); None for any other ablation or without a baseline run."""
    from lab.ablation import load_ablation
    from lab.ablation.memory_trade import carries_memory, format_memory, from_ablation

    if all(cfg.memory == ablation.baseline.memory for cfg in ablation.arms.values()):
        return None
    runs = load_ablation(ablation, store, repeats, seeds)
    if not carries_memory(runs):
        return None
    try:
        return format_memory(from_ablation(runs, table=table))
    except ValueError:  # no finished baseline run: the table already says so
        return None


def _print_card(df: Any, base: RunConfig, budget_pt: float) -> None:
    """The one answer this table gives (:mod:`lab.doctor.recommendation`, the dashboard's card) and how to take it
    away as code: an ablation ends in an action, not only a table."""
    from lab.doctor.recommendation import code_line, recommend

    workload = base.workload_spec or base.workload
    card = recommend(df, workload=workload, size=base.size, budget_pt=budget_pt)
    print("\nrecommendation: " + card.headline())
    code = code_line(card, workload, base.size)
    if code:
        print(code)


def _print_versus(df: Any, base: RunConfig) -> None:
    """This machine's crossover map's prediction per arm beside what the ablation measured, so a user sees where
    the map was right before trusting it on a model of their own."""
    from lab.crossover.versus import versus_lines
    from lab.doctor.rates import crossover_path

    path = crossover_path()  # this machine's map, or $LAB_CROSSOVER_JSON's
    print("\n".join(versus_lines(df, base.workload_spec or base.workload, path, size=base.size,
                                 model_scale=base.model_scale)))
