"""Skew cost across ranks: the accuracy a 2-rank DDP run loses when its shards are skewed, vs hash sharding.

    python benchmarks/data_skew.py [--quick] [--json PATH]

Each arm is a real 2-rank gloo DDP ``lab.run`` of ``vision`` (ResNet with BatchNorm on MNIST digits) in which
each rank reads its own shard (``ddp.shard``): ``hash`` of the row index (the reference), ``strided``,
``contiguous`` over the split as stored, and ``contiguous`` over the split sorted by label (rank 0 gets
digits 0-4, rank 1 digits 5-9). Figure: each arm's test-accuracy delta vs ``hash`` with the same seed
(:func:`lab.data.studies.skew.ddp_skew_cost`), mean over seeds with a bootstrap 95 % CI of the mean; the
goal states that a label-sorted contiguous split costs accuracy (delta < 0). Accuracy deltas are not timings,
so a busy machine does not bias them; with 3 seeds the CI is coarse (--quick: 3 seeds; full: 5).
"""

from __future__ import annotations

from _common import emit, figure, parse_args

from lab import RunConfig, run
from lab.config import DDPConfig
from lab.data.studies.skew import ddp_skew_cost


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    seeds = (0, 1, 2) if args.quick else (0, 1, 2, 3, 4)
    base = RunConfig(workload="vision", size="tiny", device="cpu", ddp=DDPConfig(world_size=2), latency_repeats=0)
    out = ddp_skew_cost(run, base, seeds=seeds)
    ref = out["arms"][0]
    figs = [figure("skew: hash sharding accuracy (reference)", sum(ref["metric"]) / len(ref["metric"]),
                   unit="accuracy", family="data", note=f"mean over seeds {list(seeds)}; 2-rank gloo DDP, vision tiny")]
    for arm in out["arms"][1:]:
        label_sorted = arm["shard_order"] == "label"
        figs.append(figure(f"skew: {arm['arm']} - hash", arm["delta_mean"], unit="accuracy delta",
                           ci=tuple(arm["ci95"]), family="data",
                           goal="< 0 (skewed shards cost accuracy)" if label_sorted else None,
                           met=arm["ci95"][1] < 0 if label_sorted else None,
                           note=f"per-seed deltas {[round(d, 4) for d in arm['deltas']]}"))
    emit("data_skew", args, figs, study=out)


if __name__ == "__main__":
    main()
