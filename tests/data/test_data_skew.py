"""Skew across DDP ranks (issue 18, item 5): the per-rank shards ``ddp.shard`` cuts, the door that hands each
rank its own shard, and the study's arithmetic. Effects only: which rows and labels a rank sees, never a time."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.config import DDPConfig, RunConfig
from lab.context import prepare
from lab.data.sharding import STRATEGIES
from lab.data.studies.skew import ARMS, ddp_skew_cost, rank_partition


def test_config_names_every_strategy_and_refuses_bad_values():
    assert ("batch", *STRATEGIES) == DDPConfig.SHARDS
    with pytest.raises(ValueError, match="ddp.shard='zigzag'"):
        DDPConfig(world_size=2, shard="zigzag")
    with pytest.raises(ValueError, match="ddp.shard='hash'.*world_size > 1"):
        DDPConfig(grad_accum_steps=2, shard="hash")
    with pytest.raises(ValueError, match="ddp.shard_order='label'.*other than 'batch'"):
        DDPConfig(world_size=2, shard_order="label")
    with pytest.raises(ValueError, match="ddp.shard_order='time'"):
        DDPConfig(world_size=2, shard="contiguous", shard_order="time")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("order", ["stored", "label"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_partition_the_split_into_equal_disjoint_shards(strategy, order, world_size):
    labels = np.random.default_rng(0).integers(0, 10, size=211)
    parts = [rank_partition(labels, world_size, r, strategy, order=order, seed=1) for r in range(world_size)]
    assert len({len(p) for p in parts}) == 1  # equal steps per rank, or DDP hangs
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)  # no row on two ranks
    assert len(joined) >= len(labels) - world_size * (12 if strategy == "hash" else 1)  # only the uneven tail dropped


def test_strategies_give_different_rank_partitions():
    labels = np.repeat(np.arange(4), 25)
    rank0 = {(s, o): frozenset(rank_partition(labels, 2, 0, s, order=o).tolist())
             for s in STRATEGIES for o in ("stored", "label")}
    stored = [rank0[(s, "stored")] for s in STRATEGIES]
    assert len(set(stored)) == len(STRATEGIES)  # contiguous, strided and hash own different rows
    assert rank0[("contiguous", "stored")] == frozenset(range(50))
    assert rank0[("strided", "stored")] == frozenset(range(0, 100, 2))


@settings(max_examples=25, deadline=None)
@given(classes=st.integers(2, 12), per_class=st.integers(1, 30), world_size=st.integers(2, 4),
       seed=st.integers(0, 2**16))
def test_label_sorted_contiguous_gives_ranks_disjoint_labels(classes, per_class, world_size, seed):
    labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class))
    if len(labels) < world_size:
        return
    sets = [set(labels[rank_partition(labels, world_size, r, "contiguous", order="label")].tolist())
            for r in range(world_size)]
    shared = [a & b for i, a in enumerate(sets) for b in sets[i + 1:]]
    assert sum(len(s) for s in shared) <= world_size - 1  # only a class cut by a boundary is on two ranks
    if classes % world_size == 0:
        assert not any(shared)  # boundaries fall between classes: no label on two ranks
    if per_class >= 25:  # the reference mixes: with enough rows every rank sees (almost) every class
        hashed = [set(labels[rank_partition(labels, world_size, r, "hash", seed=seed)].tolist())
                  for r in range(world_size)]
        assert all(len(h) >= classes - 1 for h in hashed)


def _rank_labels(shard: str, order: str, rank: int) -> torch.Tensor:
    """The labels one rank's loader yields in an epoch, through the real doors (data builds, distributed wraps)."""
    cfg = RunConfig(workload="vision", size="tiny", device="cpu",
                    ddp=DDPConfig(world_size=2, shard=shard, shard_order=order))
    with prepare(cfg) as ctx:
        ctx.ddp = SimpleNamespace(info=SimpleNamespace(distributed=True, rank=rank, world_size=2))
        loader = ctx.make_loader()
        loader.set_epoch(0)
        return torch.cat([batch[-1] for batch in loader])


def test_the_doors_hand_each_rank_its_own_shard():
    low, high = _rank_labels("contiguous", "label", 0), _rank_labels("contiguous", "label", 1)
    assert set(low.tolist()) == set(range(5)) and set(high.tolist()) == set(range(5, 10))  # 100 of each digit
    assert len(low) == len(high) == 480  # 500 rows per rank in batches of the per-rank 32 (drop_last)
    mixed = _rank_labels("hash", "stored", 0)
    assert set(mixed.tolist()) == set(range(10))
    sliced = _rank_labels("batch", "stored", 1)  # the default: a slice of a global batch of 64
    assert set(sliced.tolist()) == set(range(10)) and len(sliced) == 15 * 32


def test_skew_cost_pairs_deltas_by_seed_against_hash():
    calls = []
    acc = {"hash": 0.80, "strided": 0.81, "contiguous/stored": 0.79, "contiguous/label": 0.70}

    def fake_run(cfg: RunConfig) -> SimpleNamespace:
        calls.append((cfg.seed, cfg.ddp.shard, cfg.ddp.shard_order))
        key = cfg.ddp.shard if cfg.ddp.shard in ("hash", "strided") else f"{cfg.ddp.shard}/{cfg.ddp.shard_order}"
        return SimpleNamespace(metric=acc[key] + 0.01 * cfg.seed, metric_name="accuracy")  # seed noise cancels

    base = RunConfig(workload="vision", size="tiny", ddp=DDPConfig(world_size=2))
    out = ddp_skew_cost(fake_run, base, seeds=(0, 1, 2), n_boot=200)
    assert len(calls) == 3 * len(ARMS) and {c[0] for c in calls} == {0, 1, 2}
    by_arm = {a["arm"]: a for a in out["arms"]}
    assert by_arm["hash"]["deltas"] == [0.0, 0.0, 0.0]
    label = by_arm["contiguous, label-sorted"]
    assert label["delta_mean"] == pytest.approx(-0.10)
    assert label["ci95"][0] == pytest.approx(-0.10) and label["ci95"][1] == pytest.approx(-0.10)
    assert by_arm["strided"]["delta_mean"] == pytest.approx(0.01)
    with pytest.raises(ValueError, match="world_size=1"):
        ddp_skew_cost(fake_run, dataclasses.replace(base, ddp=DDPConfig()))
    with pytest.raises(ValueError, match="first arm"):
        ddp_skew_cost(fake_run, base, arms=ARMS[1:])
    with pytest.raises(ValueError, match="seeds"):
        ddp_skew_cost(fake_run, base, seeds=(1, 1))
