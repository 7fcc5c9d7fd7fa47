"""Stacked recipes end to end: how far the lab's techniques, added together, take a run on this machine, and
what they cost in accuracy. Two parts, each its own ablation (``--part ctr|top|all``):

    python benchmarks/stacked.py [--quick] [--part all] [--seeds 3] [--top-scale RUNG] [--json PATH]

**ctr** (the seeds' recommendation model; ``lab.recipes.speed_stack``). Baseline: the naive setup a first
version has: every batch read in the training thread from emulated network storage (``network_fs``: 5 ms +
100 MB/s per read), fp32, eager, torch's default Adam, all cores. Arms: cumulative + thread prefetcher, + fused
Adam, + fast kernels (ctr's index_select lookups: same math); then, each on top of that whole stack, ``auto``
precision, bf16, torch.compile (left out by ``--quick``) and 50 % channel pruning with one fine-tune epoch.
Goal (issue 9): the best stack within 1 AUC point is >= 3x faster to train than the naive baseline. The seeds
claim -33 % and -41.67 % training time (1.5x and 1.71x).

**top** (issue 30; ``lab.recipes.top_stack``): vision small at scale m, the techniques that pay on a larger
model: fused Adam + ``auto`` precision and fused Adam + bf16 (training; bf16 left out where it is emulated),
channels 50 % (3 fine-tune epochs), and
the deployable stack fused Adam + channels 50 % + static int8 (PT2E), against plain fp32 eager training and
inference. int8 refuses a run trained under autocast, so the deployable stack trains in fp32.

Both: same epochs and batch size in every arm; training time end to end (loop + compile + the auto probe +
fine-tune); seeds 0-2 (``--seeds N``: 0..N-1), one run each, arms interleaved (each round starts one arm
later); speedups are ratios of medians with bootstrap 95 % CIs over the runs; accuracy deltas are medians next
to the seed-to-seed spread. ``--quick`` runs tiny sizes. With ``--json`` an existing file keeps the other part's figures
(``parts``), so the two parts can be measured at different times.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import emit, figure

from lab import ResultStore, RunConfig
from lab.ablation import Ablation, best_under_budget, run_ablation
from lab.recipes import SPEED_EXTRAS, speed_stack, top_stack

GOAL_SPEEDUP = 3.0
BUDGET_PT = 1.0
SEED_CLAIMS = "seeds: -33 % and -41.67 % training time (1.5x, 1.71x)"
#: Issue 30: "a vision stack of channel pruning + static int8 + bf16 where native should exceed 5x" (inference).
TOP_GOAL = 5.0
#: The top part's rung and training length: vision small at scale m (308 k parameters, 78 s for 3 seeds here), where
#: channels and int8 pay (the size's own scale, 77 k parameters, is dispatch-bound); --top-scale picks another.
TOP = {"workload": "vision", "size": "small", "model_scale": "m", "epochs": 2}
TOP_QUICK = {"workload": "vision", "size": "tiny", "model_scale": None, "epochs": None}


def delta(row: Any, metric: str) -> str:
    """The metric change in points (+ = better than the baseline) next to the seed-to-seed spread."""
    d = 0.0 - float(row["acc_loss_pt"])  # 0.0 - x: never prints "-0.00"
    return f"{metric} {d:+.2f} pt (seed spread {float(row['noise_pt']):.2f} pt)"


def _run(ablation: Ablation, seeds: int) -> tuple[Any, float]:
    t0 = time.perf_counter()  # the whole ablation's wall time, one event reported as a figure: nothing to interleave
    with tempfile.TemporaryDirectory() as tmp, ResultStore(Path(tmp) / "stacked.sqlite") as store:
        df = run_ablation(ablation, repeats=1, seeds=tuple(range(seeds)), store=store,
                          progress=lambda ev: ev.get("phase") == "ablation" and print(
                              f"  [{ev['done']}/{ev['total']}] {ev['arm']} seed {ev['seed']}", flush=True))
    return df, time.perf_counter() - t0


def _why(row: dict[str, Any]) -> str:
    return row["why"] if isinstance(row["why"], str) else "; ".join(row["why"] or [])


def _speed(row: dict[str, Any], col: str) -> tuple[float, tuple[float, float] | None]:
    lo, hi = row.get(f"{col}_lo"), row.get(f"{col}_hi")
    ci = (lo, hi) if lo is not None and hi is not None and lo == lo and hi == hi else None
    return row[col], ci


def ctr_part(quick: bool, seeds: int = 3) -> dict[str, Any]:
    size = "tiny" if quick else "small"
    base = RunConfig(workload="ctr", size=size, threads=2, latency_repeats=5)
    # --quick leaves compile out: a cold compile is ~10 s on 2 cores, a third of the quick budget.
    extras = [e for e in SPEED_EXTRAS if not (quick and e == "compile")]
    df, wall_s = _run(speed_stack(base, storage="network_fs", extras=extras), seeds)
    figures = []
    for row in df.to_dict("records"):
        if row["arm"] == "baseline":
            figures.append(figure(f"ctr/{size} naive fp32 baseline training time", row["train_time_s"], unit="s",
                                  family="stacked", note=f"AUC {row['metric']:.4f}"))
            continue
        if row["status"] != "ok":
            figures.append(figure(f"+{row['arm']}", math.nan, unit="x", family="stacked",
                                  note=f"failed: {row['error']}"))
            continue
        value, ci = _speed(row, "train_speedup")
        figures.append(figure(f"{row['arm']} training speedup vs naive", value, unit="x", ci=ci, family="stacked",
                              note=f"{delta(row, 'AUC')}; step {row['step_speedup']:.2f}x; {_why(row)[:160]}"))
    best = best_under_budget(df, BUDGET_PT)
    if best is not None:
        value, ci = _speed(best, "train_speedup")
        figures.append(figure(f"best stack within {BUDGET_PT:g} pt AUC: {best['arm']}", value, unit="x", ci=ci,
                              goal=f">= {GOAL_SPEEDUP:g}x at <= 1 pt AUC", met=bool(value >= GOAL_SPEEDUP),
                              family="stacked", note=f"{delta(best, 'AUC')}; {SEED_CLAIMS}"))
    else:
        figures.append(figure("best stack within 1 pt AUC: none", math.nan, unit="x",
                              goal=f">= {GOAL_SPEEDUP:g}x at <= 1 pt AUC", met=False, family="stacked"))
    return {"figures": figures, "size": size, "wall_s": wall_s, "seeds": seeds, "table": df.to_dict("records")}


def top_part(quick: bool, seeds: int = 3, scale: str | None = None) -> dict[str, Any]:
    spec = dict(TOP_QUICK if quick else TOP)
    if scale:
        spec["model_scale"] = scale
    base = RunConfig(workload=spec["workload"], size=spec["size"], model_scale=spec["model_scale"],
                     epochs=spec["epochs"], threads=2, latency_repeats=5, device="cpu")
    ablation = top_stack(base)
    for arm, why in ablation.skipped.items():
        print(f"  skipped {arm}: {why}", flush=True)
    df, wall_s = _run(ablation, seeds)
    rung = f"{spec['workload']}/{spec['size']}" + (f"@{spec['model_scale']}" if spec["model_scale"] else "")
    figures = [figure(f"top {rung} fp32 baseline training time", float(df.iloc[0]["train_time_s"]), unit="s",
                      family="stacked", note=f"accuracy {df.iloc[0]['metric']:.4f}; {spec['epochs'] or 'default'} "
                      "epochs; inference latency is the final model's (fp32 eager for the baseline)")]
    figures += [figure(f"top {rung} {arm}", math.nan, unit="x", family="stacked", note=f"skipped: {why}")
                for arm, why in ablation.skipped.items()]
    for row in df.to_dict("records"):
        if row["arm"] == "baseline":
            continue
        if row["status"] != "ok":
            figures.append(figure(f"top {rung} {row['arm']}", math.nan, unit="x", family="stacked",
                                  note=f"failed: {row['error']}"))
            continue
        for col, what in (("train_speedup", "training"), ("infer_speedup", "inference")):
            value, ci = _speed(row, col)
            if value is None or value != value:  # the arm cannot change that axis (int8 on training): no figure
                continue
            whole = row["arm"] == "fused_optim+prune_channels50+int8_static" and col == "infer_speedup"
            figures.append(figure(
                f"top {rung} {row['arm']} {what} speedup vs fp32", value, unit="x", ci=ci, family="stacked",
                goal=f"> {TOP_GOAL:g}x" if whole else None, met=bool(value > TOP_GOAL) if whole else None,
                note=f"{delta(row, 'accuracy')}; size ratio {float(row['size_ratio']):.2f} (fp32 bytes / arm "
                     f"bytes); {_why(row)[:160]}"))
    return {"figures": figures, "rung": rung, "epochs": spec["epochs"], "wall_s": wall_s,
            "skipped": ablation.skipped, "seeds": seeds, "table": df.to_dict("records")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (well under a few minutes)")
    p.add_argument("--json", metavar="PATH", help="write the figures here (keeping the other part's)")
    p.add_argument("--part", choices=("all", "ctr", "top"), default="all")
    p.add_argument("--top-scale", default=None, metavar="RUNG",
                   help="the top part's model scale (a rung of the vision ladder: xs s m l xl; default: the size's "
                        "own); the larger, the more the inference techniques pay and the longer it trains")
    p.add_argument("--seeds", type=int, default=3,
                   help="runs per arm, seeds 0..N-1 (default 3; more narrow a CI that a noisy machine widens)")
    args = p.parse_args()
    if args.seeds < 2:
        p.error(f"--seeds {args.seeds}: need at least 2 (a CI over runs needs two)")
    parts: dict[str, Any] = {}
    if args.json and Path(args.json).exists():
        old = json.loads(Path(args.json).read_text())
        parts = dict(old.get("parts") or {})
        if not parts and old.get("figures"):  # a file from before the parts: it is the ctr part alone
            parts["ctr"] = {k: old.get(k) for k in ("figures", "size", "wall_s", "table", "measured_at")}
            parts["ctr"]["git_sha"] = (old.get("env") or {}).get("git_sha")
    if args.part in ("all", "ctr"):
        parts["ctr"] = ctr_part(args.quick, args.seeds)
    if args.part in ("all", "top"):
        parts["top"] = top_part(args.quick, args.seeds, args.top_scale)
    figures = [f for name in ("ctr", "top") if name in parts for f in parts[name]["figures"]]
    emit("stacked", args, figures, parts=parts, size=(parts.get("ctr") or {}).get("size"),
         wall_s=sum(float(v.get("wall_s") or 0) for v in parts.values()))


if __name__ == "__main__":
    main()
