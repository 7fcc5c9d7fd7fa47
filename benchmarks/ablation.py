"""What does an ablation cost, and what can it resolve on this machine?

    python benchmarks/ablation.py [--quick] [--json PATH]

Figures:
1. wall time of the dashboard's default ablation (recipe ``stacked`` on ``ctr``; tiny x 1 repeat with
   --quick, tiny x 3 repeats otherwise). Goal: a couple of minutes on 2 CPU cores (<= 120 s).
2. bookkeeping per run: the same ablation again, every run skipped from the store (resume), per run.
   Goal <= 50 ms, so resuming never costs more than a fraction of a tiny run.
3. the A/A speedup: the baseline against an identical arm, interleaved; the CI width is the smallest
   training speedup this machine can resolve at that number of repeats (not held against a goal: it
   measures the machine, including other load on it).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from _common import emit, figure, parse_args

from lab import ResultStore, RunConfig
from lab.ablation import Ablation, best_under_budget, run_ablation
from lab.recipes import stacked


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    repeats = 1 if args.quick else 3
    base = RunConfig(workload="ctr", size="tiny", threads=1)
    with tempfile.TemporaryDirectory() as tmp, ResultStore(Path(tmp) / "bench.sqlite") as store:
        ablation = stacked(base)
        # Wall times of whole ablations (one event each, the figures themselves): nothing to interleave or sync.
        t0 = time.perf_counter()
        df = run_ablation(ablation, repeats=repeats, store=store)
        wall_s = time.perf_counter() - t0
        n_runs = len(ablation.arms) * repeats
        t0 = time.perf_counter()
        run_ablation(ablation, repeats=repeats, store=store)
        skip_ms = 1e3 * (time.perf_counter() - t0) / n_runs
        aa = Ablation(name="aa", baseline=base, arms={"same": base.with_overrides(latency_repeats=21)})
        aa_df = run_ablation(aa, repeats=max(3, repeats), store=store).set_index("arm").loc["same"]
    best = best_under_budget(df, 1.0)
    emit("ablation", args, [
        figure(f"default ablation wall time (stacked, ctr/tiny, {repeats} repeat(s), {n_runs} runs)", wall_s,
               unit="s", goal="<= 120 s", met=wall_s <= 120),
        figure("resume bookkeeping per skipped run", skip_ms, unit="ms", goal="<= 50 ms", met=skip_ms <= 50),
        figure("A/A training speedup (identical arms)", aa_df["train_speedup"], unit="x",
               ci=(aa_df["train_speedup_lo"], aa_df["train_speedup_hi"]),
               note="CI width = smallest resolvable effect here"),
        figure(f"best arm within 1 pt: {best['arm'] if best is not None else 'none'}",
               best["train_speedup"] if best is not None else float("nan"), unit="x"),
    ], table=df.to_dict("records"))


if __name__ == "__main__":
    main()
