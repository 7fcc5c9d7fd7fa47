"""The stacked recipe on ctr (the seeds' recommendation model): how far do the lab's techniques, added one at a
time, take a naive fp32 training run on this machine, and what does it cost in AUC?

    python benchmarks/stacked.py [--quick] [--json PATH]

Baseline: the naive setup a first version has: every batch read in the training thread from emulated network
storage (``network_fs``: 5 ms + 100 MB/s per read), fp32, eager, torch's default Adam, all cores.
Arms (``lab.recipes.speed_stack``): cumulative + thread prefetcher, + fused Adam, + fast kernels (ctr's
index_select lookups: same math); then, each on top of that whole stack, ``auto`` precision (keeps fp32
unless a low precision is measurably faster here), bf16, torch.compile (left out by ``--quick``) and 50 %
channel pruning with one fine-tune epoch. Same epochs and batch size in every arm. Training time is end to
end: loop + compile + the auto probe + fine-tune. Seeds 0-2, one run each, arms interleaved; speedups are
ratios of medians with bootstrap 95 % CIs over the three runs; AUC deltas are medians, next to the seed-to-seed spread.

Goal (issue 9): the best stack within 1 AUC point is >= 3x faster to train than the naive baseline. The seeds
claim -33 % and -41.67 % training time (1.5x and 1.71x). ``--quick`` runs ctr/tiny (seconds per run),
the full setting ctr/small (one pass over 600k rows).
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

from _common import emit, figure, parse_args

from lab import ResultStore, RunConfig
from lab.ablation import best_under_budget, run_ablation
from lab.recipes import SPEED_EXTRAS, speed_stack

GOAL_SPEEDUP = 3.0
BUDGET_PT = 1.0
SEED_CLAIMS = "seeds: -33 % and -41.67 % training time (1.5x, 1.71x)"


def auc_delta(row) -> str:  # noqa: ANN001 - a summary row (dict or Series)
    """The AUC change in points (+ = better than naive) next to the seed-to-seed spread."""
    delta = 0.0 - float(row["acc_loss_pt"])  # 0.0 - x: never prints "-0.00"
    return f"{delta:+.2f} pt (seed spread {float(row['noise_pt']):.2f} pt)"


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    size = "tiny" if args.quick else "small"
    base = RunConfig(workload="ctr", size=size, threads=2, latency_repeats=5)
    # --quick leaves compile out: a cold compile is ~10 s on 2 cores, a third of the quick budget.
    extras = [e for e in SPEED_EXTRAS if not (args.quick and e == "compile")]
    ablation = speed_stack(base, storage="network_fs", extras=extras)
    t0 = time.perf_counter()  # the whole ablation's wall time, one event reported as a figure: nothing to interleave
    with tempfile.TemporaryDirectory() as tmp, ResultStore(Path(tmp) / "stacked.sqlite") as store:
        df = run_ablation(ablation, repeats=1, seeds=(0, 1, 2), store=store,
                          progress=lambda ev: ev.get("phase") == "ablation" and print(
                              f"  [{ev['done']}/{ev['total']}] {ev['arm']} seed {ev['seed']}", flush=True))
    wall_s = time.perf_counter() - t0
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
        why = row["why"] if isinstance(row["why"], str) else "; ".join(row["why"] or [])
        figures.append(figure(
            f"{row['arm']} training speedup vs naive", row["train_speedup"], unit="x",
            ci=(row["train_speedup_lo"], row["train_speedup_hi"]), family="stacked",
            note=f"AUC {auc_delta(row)}; step {row['step_speedup']:.2f}x; {why[:160]}"))
    best = best_under_budget(df, BUDGET_PT)
    if best is not None:
        met = bool(best["train_speedup"] >= GOAL_SPEEDUP)
        figures.append(figure(
            f"best stack within {BUDGET_PT:g} pt AUC: {best['arm']}", best["train_speedup"], unit="x",
            ci=(best["train_speedup_lo"], best["train_speedup_hi"]), goal=f">= {GOAL_SPEEDUP:g}x at <= 1 pt AUC",
            met=met, family="stacked",
            note=f"AUC {auc_delta(best)}; {SEED_CLAIMS}"))
    else:
        figures.append(figure("best stack within 1 pt AUC: none", math.nan, unit="x",
                              goal=f">= {GOAL_SPEEDUP:g}x at <= 1 pt AUC", met=False, family="stacked"))
    emit("stacked", args, figures, size=size, wall_s=wall_s, table=df.to_dict("records"))


if __name__ == "__main__":
    main()
