"""The accuracy cost of skewed shards: train on one rank's part of a user-sorted click log, test on all.

Why: the skew report shows that a contiguous split of a sorted log hands each rank a different population;
this measures what that does to the model. A rank (or a worker whose batches are not mixed across shards)
that only sees its part learns that part's users; a hash split gives every part the whole distribution, so
its model tests like one trained on a random sample of the same size.
"""

from __future__ import annotations

import numpy as np
import torch

from lab.data.sharding import part_of


def part_accuracy(strategy: str, *, parts: int = 4, part: int = 0, size: str = "tiny", steps: int = 60,
                  seed: int = 0, sort_by: str = "user") -> dict[str, float]:
    """Train the ``ctr`` model of ``size`` on part ``part`` of ``parts`` of a log sorted by ``sort_by``
    ('user' or 'dense0'), ``steps`` steps, then report AUC on a held-out test set drawn from the whole log."""
    from lab.config import DataConfig
    from lab.data.loaders import make_loader
    from lab.train import fit, make_optimizer, seed_everything
    from lab.workloads import get_workload
    from lab.workloads.ctr import criteo_like_vocab, generate_click_log, preprocess_dense

    wl = get_workload("ctr")
    spec = wl.sizes[size]
    vocab = criteo_like_vocab(spec.data.get("max_vocab", 100_000), 26)
    n_train, n_test = spec.n_train, spec.n_test
    log = generate_click_log(0, n_train + n_test, seed=seed, vocab=vocab)
    dense, cat, label = preprocess_dense(log["dense"]), torch.tensor(log["cat"]), torch.tensor(log["label"])
    if sort_by not in ("user", "dense0"):
        raise ValueError(f"sort_by={sort_by!r} is invalid: allowed: user, dense0")
    key = log["user"][:n_train] if sort_by == "user" else log["dense"][:n_train, 0]
    order = torch.from_numpy(np.argsort(key, kind="stable"))
    owner = part_of(n_train, parts, strategy, ids=log["row_id"][:n_train][order.numpy()], seed=seed)
    mine = order[torch.from_numpy(owner == part)]
    train = (dense[mine], cat[mine], label[mine])
    seed_everything(seed)
    model = wl.make_model(spec)
    opt = make_optimizer("adam", model.parameters(), spec.lr)
    loader = make_loader(train, DataConfig(), spec.batch_size, seed=seed)
    fit(model, opt, loader, wl, torch.device("cpu"), epochs=100, max_steps=steps)
    model.eval()
    with torch.no_grad():
        out = model(dense[n_train:], cat[n_train:])
    metrics = wl.evaluate(out, label[n_train:])
    return {"strategy": strategy, "rows": len(mine), "part_label_rate": float(train[2].mean()),
            **{k: float(v) for k, v in metrics.items()}}
