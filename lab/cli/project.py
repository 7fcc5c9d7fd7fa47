"""``python -m lab project``: a full run of ``--epochs E`` over ``--rows N`` projected per arm from short measured
runs (:mod:`lab.ablation.project`), said the seeds' way ("baseline 24.0 h -> bf16+prefetch 16.3 h [15.1, 17.4],
accuracy -0.2 pt [-0.4, +0.0]"), with each arm's measured peak memory and step-time cost
(:func:`lab.ablation.memory_trade.format_memory`: each run's step's real peak, ``step_peak_bytes``, measured on a
warm-up step; the roles' sum, said so, for runs stored before it was); ``--memory-budget MB`` adds the seeds'
sentence read from those runs ("250 MB: does not fit (baseline 310 MB) -> fits at 241 MB with accum2, 1.26x the
time per step ...") and the largest batch that fits (:mod:`lab.ablation.memory_fit`).

The measured runs take the config's own flags (``ablate``'s defaults); ``--epochs`` here is the projected run's,
``--measure-epochs`` the measured one's (default: the size's). Without ``--techniques`` / ``--recipe`` only the
baseline is measured and projected.
"""

from __future__ import annotations

import argparse
import json
import sys

from lab.cli.ablate import ABLATE_DEFAULTS
from lab.cli.options import UsageError, config_from_args, json_file, json_flag, store_flags, write_json
from lab.config.flags import add_config_fields
from lab.registry import OPTIONS, RECIPES

NAME, HELP = "project", "project a full training run (epochs x rows) per arm from short measured runs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_fields(p)  # its --epochs is the projected run's (below)
    g = p.add_argument_group("projection")
    g.add_argument("--rows", type=int, default=None, help="training rows of the full run (default: the size's)")
    g.add_argument("--test-rows", type=int, default=None, help="evaluation rows (default: the size's)")
    g.add_argument("--measure-epochs", type=int, default=None, help="epochs of the measured runs (default: the size's)")
    g.add_argument("--recipe", default=None, help=f"arms from a recipe: {', '.join(RECIPES)}")
    g.add_argument("--techniques", default="", help=f"comma-separated stack: {', '.join(OPTIONS)}")
    g.add_argument("--repeats", type=int, default=3, help="measured runs per arm and seed (default: 3)")
    g.add_argument("--seeds", type=int, default=1, help="number of seeds, 0..N-1 (default: 1)")
    g.add_argument("--budget-pt", type=float, default=1.0,
                   help="accuracy budget in metric points an arm may lose against the baseline (default: 1.0)")
    g.add_argument("--memory-budget", type=float, default=None, metavar="MB",
                   help="say which measured arm fits MB of peak memory and at what time cost, and find the "
                        "largest batch whose measured peak memory is under MB")
    json_flag(g, "the projection")
    store_flags(g, "results store (default: $LAB_RESULTS_DB or results/lab.sqlite)")


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from lab.ablation import load_ablation, run_ablation
    from lab.ablation.memory_fit import format_fit, largest_batch
    from lab.ablation.memory_trade import format_memory, from_ablation
    from lab.ablation.project import format_projection, project_arms
    from lab.recipes import from_techniques, get_recipe
    from lab.store import ResultStore

    epochs = vars(args).pop("epochs", None)
    if epochs is None or epochs < 1:
        raise UsageError("--epochs E (the projected run's epochs, >= 1) is required")
    for flag, value in (("rows", args.rows), ("test-rows", args.test_rows), ("measure-epochs", args.measure_epochs),
                        ("repeats", args.repeats), ("seeds", args.seeds)):
        if value is not None and value < 1:
            raise UsageError(f"{flag}={value} is invalid: allowed: >= 1")
    if args.memory_budget is not None and not 0 < args.memory_budget < float("inf"):
        raise UsageError(f"--memory-budget={args.memory_budget} is invalid: allowed: a number of MB > 0")
    base = config_from_args(args, defaults={**ABLATE_DEFAULTS, "epochs": args.measure_epochs})
    json_out = json_file(args)  # refused now, not after the measured runs
    techs = [t.strip() for t in args.techniques.split(",") if t.strip()]
    if techs:
        ablation = from_techniques("project", base, [techs])
    elif args.recipe:
        ablation = get_recipe(args.recipe)(base)
    else:
        ablation = None  # the baseline alone
    seeds = list(range(args.seeds))
    with ResultStore(args.store) as store:
        if ablation is None:
            runs, table = {"baseline": _baseline_runs(base, args.repeats, seeds, store)}, None
        else:
            with tqdm(total=len(ablation.arms) * args.repeats * len(seeds), unit="run", file=sys.stderr) as bar:
                table = run_ablation(ablation, repeats=args.repeats, seeds=seeds, store=store, budget_pt=args.budget_pt,
                                     step_peak=True,
                                     progress=lambda e: bar.update(1) if e["phase"] == "ablation" else None)
            runs = load_ablation(ablation, store, repeats=args.repeats, seeds=seeds)
    projected = project_arms(runs, epochs=epochs, rows=args.rows, test_rows=args.test_rows)
    trade = from_ablation(runs, budget_mb=args.memory_budget, table=table)  # every figure a measured run's
    found = largest_batch(base, args.memory_budget) if args.memory_budget is not None else None
    payload = json.dumps({"epochs": epochs, "rows": args.rows, "arms": projected, "memory": found,
                          "memory_trade": trade}, default=str)
    if args.json == "-":
        print(payload)
        return 0
    rows = args.rows or "the size's"
    print(f"projected full run: {epochs} epochs over {rows} rows "
          f"({base.workload}/{base.size}, measured on {args.repeats * len(seeds)} run(s) per arm)")
    print(format_projection(projected, table))
    print(format_memory(trade, projected))
    if found is not None:  # another measure than the arms' roles: said, so the two peaks are not read as one
        print("largest batch, by each try's own process peak (a fresh process per try: rss on CPU, runtime and "
              "data included; cuda on a GPU):")
        print(format_fit(found))
    if json_out is not None:
        write_json(payload, json_out)
    return 0


def _baseline_runs(cfg, repeats: int, seeds: list[int], store):  # noqa: ANN001, ANN202 - a RunConfig, a store
    """The baseline alone, ``repeats`` runs per seed, stored under ``project:`` labels."""
    from lab.memory.roles import step_peak_where_free
    from lab.train import run

    out = []
    for s in seeds:
        for rep in range(repeats):
            with step_peak_where_free(cfg):  # the memory line's peak: the step's real one (on a warm-up step)
                r = run(cfg.with_overrides(seed=s), on_error="record")
            store.add(r, label=f"project:{cfg.workload}/{cfg.size}:baseline:r{rep}")
            if r.status != "ok":
                raise UsageError(f"the measured baseline failed: {r.error}")
            out.append(r)
    return out
