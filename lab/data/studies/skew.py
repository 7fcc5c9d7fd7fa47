"""The accuracy cost of skewed shards: train on one rank's part of a user-sorted click log, test on all.

Why: the skew report shows that a contiguous split of a sorted log hands each rank a different population;
this measures what that does to the model. A rank (or a worker whose batches are not mixed across shards)
that only sees its part learns that part's users; a hash split gives every part the whole distribution, so
its model tests like one trained on a random sample of the same size.

:func:`ddp_skew_cost` measures the same question where it matters, in a real 2-rank DDP run: each rank reads
its own shard (``ddp.shard``, cut by :func:`rank_partition` from the split as stored or sorted by label,
``ddp.shard_order``) and the gradients are averaged every step. Averaging makes the *gradient* of a skewed
pair of ranks unbiased, so what skew costs there is what is per rank: BatchNorm statistics (DDP broadcasts
rank 0's running stats, and every rank normalises with its own skewed batch) and any uneven shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from lab.config import RunConfig
from lab.context import prepare
from lab.data.loaders import make_loader
from lab.data.sharding import STRATEGIES, part_of
from lab.measure import bootstrap_ci
from lab.workloads.ctr import criteo_like_vocab, generate_click_log, preprocess_dense


def part_accuracy(strategy: str, *, parts: int = 4, part: int = 0, size: str = "tiny", steps: int = 60,
                  seed: int = 0, sort_by: str = "user") -> dict[str, float]:
    """Train the ``ctr`` model of ``size`` on part ``part`` of ``parts`` of a log sorted by ``sort_by``
    ('user' or 'dense0'), ``steps`` steps through the run's own ``ctx.fit``, then report AUC on a held-out
    test set drawn from the whole log."""
    if sort_by not in ("user", "dense0"):
        raise ValueError(f"sort_by={sort_by!r} is invalid: allowed: user, dense0")
    cfg = RunConfig(workload="ctr", size=size, seed=seed, max_steps=steps, device="cpu")
    with prepare(cfg) as ctx:
        spec = ctx.resolved.spec
        vocab = criteo_like_vocab(spec.data.get("max_vocab", 100_000), 26)
        n_train, n_test = spec.n_train, spec.n_test
        log = generate_click_log(0, n_train + n_test, seed=seed, vocab=vocab)
        dense, cat, label = preprocess_dense(log["dense"]), torch.tensor(log["cat"]), torch.tensor(log["label"])
        key = log["user"][:n_train] if sort_by == "user" else log["dense"][:n_train, 0]
        order = torch.from_numpy(np.argsort(key, kind="stable"))
        owner = part_of(n_train, parts, strategy, ids=log["row_id"][:n_train][order.numpy()], seed=seed)
        mine = order[torch.from_numpy(owner == part)]
        train = (dense[mine], cat[mine], label[mine])
        model = ctx.new_model()
        loader = make_loader(train, cfg.data, ctx.resolved.batch_size, seed=seed)
        ctx.fit(model, epochs=100, lr=ctx.resolved.lr, max_steps=steps, loader=loader)
        model.eval()
        with torch.no_grad():
            out = model(dense[n_train:], cat[n_train:])
        metrics = ctx.workload.evaluate(out, label[n_train:])
    return {"strategy": strategy, "rows": len(mine), "part_label_rate": float(train[2].mean()),
            **{k: float(v) for k, v in metrics.items()}}


def rank_partition(labels: torch.Tensor | np.ndarray, world_size: int, rank: int, strategy: str, *,
                   order: str = "stored", seed: int = 0) -> np.ndarray:
    """The row indices (into the split as stored) that ``rank`` of ``world_size`` trains on: the split as
    stored (``order="stored"``, time order for ctr) or sorted by label (``"label"``, stable), cut by
    ``strategy`` (:data:`lab.data.sharding.STRATEGIES`; ``hash`` hashes the stored row index with ``seed``).
    Every rank gets the same number of rows (the smallest part's; a hash split's few extra rows are dropped
    from the end of the larger parts), because DDP ranks must take the same number of steps or they hang."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is invalid: allowed: {', '.join(STRATEGIES)}")
    if order not in ("stored", "label"):
        raise ValueError(f"order={order!r} is invalid: allowed: stored, label")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is invalid: must be in 0..{world_size - 1}")
    labels = np.asarray(labels)
    n = len(labels)
    rows = np.argsort(labels, kind="stable") if order == "label" else np.arange(n)
    owner = part_of(n, world_size, strategy, ids=rows, seed=seed)
    keep = min(int((owner == r).sum()) for r in range(world_size))
    if keep == 0:
        raise ValueError(f"world_size={world_size} is invalid: a rank's shard of {n} rows would be empty")
    return rows[owner == rank][:keep]


#: The arms of :func:`ddp_skew_cost`: (label, ddp.shard, ddp.shard_order). ``hash`` is the reference.
ARMS: tuple[tuple[str, str, str], ...] = (
    ("hash", "hash", "stored"),
    ("strided", "strided", "stored"),
    ("contiguous, stored order", "contiguous", "stored"),
    ("contiguous, label-sorted", "contiguous", "label"),
)


def ddp_skew_cost(run_fn: Callable[[RunConfig], Any], base: RunConfig, *, seeds: Sequence[int] = (0, 1, 2),
                  arms: Sequence[tuple[str, str, str]] = ARMS, n_boot: int = 2000) -> dict[str, Any]:
    """Train ``base`` (which must ask for ``ddp.world_size >= 2``) once per arm x seed through ``run_fn``
    (:func:`lab.run`, passed in because this layer sits below it), and return each arm's accuracy delta
    against ``hash`` sharding with the same seed: per-seed deltas, their mean and a bootstrap 95 % CI of the
    mean (paired by seed: the seed sets the initial weights and the batch order, so pairing removes that
    noise). The first arm must be the reference ``hash``. Runs go seed by seed, arms interleaved."""
    if base.ddp.world_size < 2:
        raise ValueError(f"ddp.world_size={base.ddp.world_size} is invalid: skew across ranks needs >= 2")
    if not arms or arms[0][1] != "hash":
        raise ValueError("arms is invalid: the first arm must be the reference, ddp.shard='hash'")
    if len(seeds) < 1 or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds={tuple(seeds)!r} is invalid: must be distinct, at least one")
    metric: dict[str, list[float]] = {label: [] for label, _, _ in arms}
    metric_name = None
    for seed in seeds:
        for label, shard, order in arms:
            ddp = dataclasses.replace(base.ddp, shard=shard, shard_order=order)
            res = run_fn(dataclasses.replace(base, seed=seed, ddp=ddp))
            metric_name = res.metric_name
            metric[label].append(float(res.metric))
    ref = np.asarray(metric[arms[0][0]])
    out: dict[str, Any] = {"metric_name": metric_name, "seeds": list(seeds), "world_size": base.ddp.world_size,
                           "workload": base.workload, "size": base.size, "arms": []}
    for label, shard, order in arms:
        deltas = np.asarray(metric[label]) - ref
        est, lo, hi = bootstrap_ci(deltas, np.mean, n_boot=n_boot) if len(deltas) > 1 else (
            float(deltas.mean()), float("nan"), float("nan"))
        out["arms"].append({"arm": label, "shard": shard, "shard_order": order, "metric": metric[label],
                            "deltas": deltas.tolist(), "delta_mean": est, "ci95": [lo, hi]})
    return out
