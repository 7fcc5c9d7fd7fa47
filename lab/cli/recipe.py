"""``python -m lab recipe``: the plain-PyTorch training script of a technique stack (:mod:`lab.portable`), with no
``lab`` import, printed or written to ``--out``. The stack is ``--techniques`` (option names) on the configuration
the config's own flags describe (``--workload``, ``--size``: the script's default epochs, batch and lr;
``--world-size 2``: data-parallel under torchrun), or a stored run (``--run RUN_ID``: its configuration, the choices
it measured for ``auto`` and its figures in the header). Conflicting options, an unknown one, or what the script
cannot express are one line and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from lab.cli.options import UsageError, config_from_args, store_flags, writable_file
from lab.config.flags import add_config_fields
from lab.registry import OPTIONS

NAME, HELP = "recipe", "print the plain-PyTorch training script of a technique stack (no lab import)"
#: The configuration a recipe starts from unless a flag says otherwise: the dense reference workload, whose
#: defaults (epochs, batch, lr) become the script's.
RECIPE_DEFAULTS = {"workload": "mlp", "size": "small"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_fields(p)
    g = p.add_argument_group("recipe")
    g.add_argument("--techniques", default="",
                   help=f"comma-separated stack of options: {', '.join(OPTIONS)}")
    g.add_argument("--run", metavar="RUN_ID", default=None,
                   help="a stored run (id or unique prefix): its configuration is the stack, its figures go in the "
                        "header and its measured choices (amp_auto, int8_auto) are the code")
    store_flags(g, "results store of --run (default: $LAB_RESULTS_DB or results/lab.sqlite)")
    g.add_argument("--out", metavar="FILE", default=None, help="write the script here instead of printing it")


def _stored_run(run_id: str, store_path: str | None):  # noqa: ANN202 - a RunResult
    from lab.store import ResultStore

    with ResultStore(store_path, read_only=True) as store:
        ids = [r[0] for r in store.query("SELECT run_id FROM runs WHERE run_id LIKE ?", (run_id + "%",))]
        if len(ids) != 1:
            raise UsageError(f"--run {run_id}: {'no stored run' if not ids else f'{len(ids)} runs'} match it in "
                             f"{store.path}")
        return store.get(ids[0])


def _config_flags_given(args: argparse.Namespace) -> list[str]:
    """The config fields given as flags (config flags default to ``argparse.SUPPRESS``: only given ones are set)."""
    from lab.config import FAMILIES, RunConfig

    keys = {f.name for f in dataclasses.fields(RunConfig) if f.name not in FAMILIES}
    keys |= {f"{fam}.{f.name}" for fam, cls in FAMILIES.items() for f in dataclasses.fields(cls)}
    return sorted(k for k in vars(args) if k in keys)


def main(args: argparse.Namespace) -> int:
    from lab.config import RunConfig
    from lab.portable import build, config_of

    techs = [t.strip() for t in args.techniques.split(",") if t.strip()]
    out = writable_file(args.out, "--out") if args.out else None
    run = None
    if args.run:
        given = _config_flags_given(args)
        if techs or given:
            raise UsageError(f"--run with {'--techniques' if techs else ', '.join(given)}: a stored run's "
                             "configuration is the stack its figures describe; give --run alone")
        run = _stored_run(args.run, args.store)
        cfg = RunConfig.from_dict(run.config)
    else:
        for name in techs:
            OPTIONS.get(name)  # an unknown name: one line listing the known ones
        cfg = config_of(techs, config_from_args(args, defaults=RECIPE_DEFAULTS))
    command = " ".join(["python -m lab recipe", *(["--techniques", ",".join(techs)] if techs else []),
                        *(["--run", run.run_id[:8]] if run else [])])
    recipe = build(cfg, techniques=techs, run=run, command=command)
    if out is None:
        print(recipe.text, end="")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(recipe.text)
    print(f"wrote {out}: {recipe.title}; run it: {recipe.how_to_run(out.name)}", file=sys.stderr)
    return 0
