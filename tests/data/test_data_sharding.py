"""Sharding: exactly-once coverage for every strategy × world size × workers, resume, skew detection."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lab.data.sharding import STRATEGIES, epoch_order, resume, shard_indices, skew_report


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_every_sample_exactly_once_per_epoch(strategy, world_size, num_workers):
    n = 101  # prime: no split is even, so off-by-one gaps would show
    seen = np.concatenate([
        epoch_order(shard_indices(n, world_size=world_size, rank=r, num_workers=num_workers, worker=w,
                                  strategy=strategy), seed=3, epoch=1)
        for r in range(world_size) for w in range(max(num_workers, 1))])
    assert np.array_equal(np.sort(seen), np.arange(n))


def test_strided_is_the_seeds_slice():
    data = np.arange(50)
    for i in range(4):
        assert np.array_equal(data[shard_indices(50, world_size=4, rank=i)], data[i::4])


def test_order_is_deterministic_per_seed_and_epoch():
    idx = shard_indices(64, world_size=2, rank=1, strategy="hash")
    assert np.array_equal(epoch_order(idx, seed=1, epoch=2), epoch_order(idx, seed=1, epoch=2))
    assert not np.array_equal(epoch_order(idx, seed=1, epoch=2), epoch_order(idx, seed=1, epoch=3))


def test_resume_mid_epoch_has_no_repeats_or_gaps():
    order = epoch_order(np.arange(40), seed=0, epoch=0)
    first = order[:3 * 8]  # three batches of 8 trained before the "crash"
    rest = resume(order, 8, 3)
    assert np.array_equal(np.concatenate([first, rest]), order)
    with pytest.raises(ValueError, match="batches_done=6"):
        resume(order, 8, 6)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(world_size=2, rank=2), "rank=2"),
    (dict(num_workers=2, worker=2), "worker=2"),
    (dict(num_workers=-1), "worker="),
    (dict(strategy="random"), "strategy='random'"),
    (dict(world_size=4, num_workers=3), "more parts than samples"),
])
def test_bad_sharding_arguments_are_named(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        shard_indices(10, **kwargs)


def test_skew_report_finds_skew_on_a_sorted_log_and_none_under_hash():
    from lab.workloads.ctr import generate_click_log

    log = generate_click_log(0, 8192, seed=0, vocab=100)
    order = np.argsort(log["dense"][:, 0], kind="stable")  # a log sorted by a feature, like by user activity
    labels, feats, ids = log["label"][order], log["dense"][order].astype(float), log["row_id"][order]
    contiguous = skew_report(labels, feats, 4, "contiguous")
    hashed = skew_report(labels, feats, 4, "hash", ids=ids)
    assert contiguous["max_feature_shift_sd"] > 1.0
    assert hashed["max_feature_shift_sd"] < 0.1
    assert hashed["label_rate_spread"] < 6 * hashed["label_rate_noise_sd"]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 500), world_size=st.integers(1, 6), num_workers=st.integers(0, 3),
       strategy=st.sampled_from(STRATEGIES), seed=st.integers(0, 2**16))
def test_property_ranks_times_workers_partition_every_dataset(n, world_size, num_workers, strategy, seed):
    parts = world_size * max(num_workers, 1)
    assume(strategy == "hash" or n >= parts)
    owned = [shard_indices(n, world_size=world_size, rank=r, num_workers=num_workers, worker=w, strategy=strategy,
                           seed=seed) for r in range(world_size) for w in range(max(num_workers, 1))]
    together = np.concatenate(owned)
    assert len(together) == n and set(together.tolist()) == set(range(n))  # every sample once, none twice


@settings(max_examples=40, deadline=None)
@given(batches=st.integers(1, 6), per_rank=st.integers(1, 5), world=st.integers(1, 4))
def test_property_rank_slices_of_one_global_batch_cover_it_exactly(batches, per_rank, world):
    from lab.distributed import RankSlicedLoader

    global_batches = [(torch.arange(b * per_rank * world, (b + 1) * per_rank * world),) for b in range(batches)]
    seen = torch.cat([x for r in range(world) for (x,) in RankSlicedLoader(global_batches, r, world)])
    assert sorted(seen.tolist()) == list(range(batches * per_rank * world))
