"""The accuracy cost of skewed shards: train on one rank's part of a user-sorted click log, test on all.

Why: the skew report shows that a contiguous split of a sorted log hands each rank a different population;
this measures what that does to the model. A rank (or a worker whose batches are not mixed across shards)
that only sees its part learns that part's users; a hash split gives every part the whole distribution, so
its model tests like one trained on a random sample of the same size.
"""

from __future__ import annotations

import numpy as np
import torch

from lab.config import RunConfig
from lab.context import prepare
from lab.data.loaders import make_loader
from lab.data.sharding import part_of
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
