"""``python -m lab ablate --recipe stacked --repeats 3`` (also ``python -m lab.ablate_cli``).

Runs a recipe (or a technique stack / factorial) through :func:`lab.ablation.run_ablation` with a tqdm bar,
stores every run in the results store (re-running resumes), and prints the table and the best arm under an
accuracy budget. A user error is one line on stderr and exit status 2, like the rest of the CLI.
"""

from __future__ import annotations

import argparse
import sys

from lab.ablation import best_under_budget, interaction_effects, run_ablation
from lab.config import SIZES, RunConfig
from lab.recipes import RECIPES, TECHNIQUES, factorial, from_techniques, get_recipe
from lab.store import ResultStore

TABLE_COLUMNS = ["arm", "status", "train_speedup", "train_speedup_lo", "train_speedup_hi", "infer_speedup",
                 "acc_loss_pt", "noise_pt", "within_noise", "size_ratio", "why"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit 2, like ``python -m lab``
        print(f"lab: error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m lab ablate", description="Run an ablation and print its table")
    p.add_argument("--recipe", default="stacked", help=f"one of: {', '.join(RECIPES)}")
    p.add_argument("--techniques", default="",
                   help=f"comma-separated stack instead of a recipe: {', '.join(TECHNIQUES)}")
    p.add_argument("--factorial", action="store_true", help="with --techniques: every subset (interactions)")
    p.add_argument("--workload", default="ctr")
    p.add_argument("--size", default="tiny", choices=SIZES)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seeds", type=int, default=1, help="number of seeds (0..N-1)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--budget-pt", type=float, default=1.0)
    p.add_argument("--db", default=None, help="results store (default: $LAB_RESULTS_DB or results/lab.sqlite)")
    p.add_argument("--csv", default=None, help="also write the table here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        base = RunConfig(workload=args.workload, size=args.size, threads=args.threads or None)
        techs = [t.strip() for t in args.techniques.split(",") if t.strip()]
        if techs:
            ablation = factorial(base, techs) if args.factorial else from_techniques("custom", base, [techs])
        else:
            ablation = get_recipe(args.recipe)(base)
        if args.seeds < 1:
            raise ValueError(f"seeds={args.seeds} is invalid: allowed: >= 1")
        from tqdm import tqdm

        with ResultStore(args.db) as store, tqdm(total=len(ablation.arms) * args.repeats * args.seeds,
                                                  unit="run", file=sys.stderr) as bar:
            def progress(event: dict) -> None:
                if event["phase"] == "ablation":
                    bar.set_postfix_str(f"{event['arm']} ({'stored' if event['skipped'] else event['status']})")
                    bar.update(1)

            df = run_ablation(ablation, repeats=args.repeats, seeds=list(range(args.seeds)), store=store,
                              progress=progress)
    except (ValueError, NotImplementedError) as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 2
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 40):
        table = df[TABLE_COLUMNS].round(3)
        table["why"] = table["why"].fillna("").str.slice(0, 50)
        print(table.to_string(index=False))
        effects = interaction_effects(df)
        if not effects.empty:
            print("\ninteractions:\n" + effects.round(3).to_string(index=False))
    best = best_under_budget(df, args.budget_pt)
    print(f"\nbest within {args.budget_pt:g} pt: "
          + (f"{best['arm']} {best['train_speedup']:.2f}x training" if best is not None else "none"))
    if args.csv:
        df.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
