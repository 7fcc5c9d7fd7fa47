"""Loaders share one batch order: the DataLoader path must deliver exactly the in-memory batches."""

from __future__ import annotations

import pytest
import torch

from lab.config import DataConfig
from lab.data import ShuffledBatchSampler, make_loader


def _tensors(n=103):
    return torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n)


def _epoch(loader, epoch):
    loader.set_epoch(epoch)
    return [tuple(t.clone() for t in b) for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_matches_memory_loader(workers):
    tensors = _tensors()
    mem = make_loader(tensors, DataConfig(), 10, seed=3)
    dl = make_loader(tensors, DataConfig(loader="dataloader", num_workers=workers), 10, seed=3)
    for epoch in (0, 1):
        a, b = _epoch(mem, epoch), _epoch(dl, epoch)
        assert len(a) == len(b) == 10
        for x, y in zip(a, b, strict=True):
            assert all(torch.equal(u, v) for u, v in zip(x, y, strict=True))


def test_epochs_differ_and_each_sample_at_most_once():
    sampler = ShuffledBatchSampler(103, 10, seed=0)
    e0 = torch.cat(list(sampler))
    sampler.set_epoch(1)
    e1 = torch.cat(list(sampler))
    assert len(e0) == 100 and len(set(e0.tolist())) == 100
    assert not torch.equal(e0, e1)


def test_no_drop_last_covers_everything_once():
    sampler = ShuffledBatchSampler(103, 10, drop_last=False, seed=0)
    idx = torch.cat(list(sampler))
    assert len(sampler) == 11 and sorted(idx.tolist()) == list(range(103))


def test_bad_sampler_inputs():
    with pytest.raises(ValueError, match="empty"):
        ShuffledBatchSampler(0, 4)
    with pytest.raises(ValueError, match="larger than the dataset"):
        ShuffledBatchSampler(5, 8)


@pytest.mark.parametrize("loader", ["naive", "thread", "device_prefetch"])
def test_data_lab_loaders_deliver_the_in_memory_batches(loader):
    ref = _epoch(make_loader(_tensors(), DataConfig(), 10, seed=3), 1)
    got = _epoch(make_loader(_tensors(), DataConfig(loader=loader), 10, seed=3), 1)
    assert len(got) == len(ref)
    assert all(torch.equal(a, b) for x, y in zip(got, ref, strict=True) for a, b in zip(x, y, strict=True))


@pytest.mark.parametrize("cfg", [DataConfig(), DataConfig(loader="naive"), DataConfig(loader="thread"),
                                 DataConfig(loader="device_prefetch"), DataConfig(loader="dataloader", num_workers=1)],
                         ids=["memory", "naive", "thread", "device_prefetch", "dataloader1"])
def test_skip_starts_the_epoch_mid_way_once(cfg):
    """What a resume relies on: ``skip(k)`` then a pass yields the epoch's batches from k on, then no more skip."""
    loader = make_loader(_tensors(), cfg, 10, seed=3)
    full = _epoch(loader, 2)
    loader.set_epoch(2)
    loader.skip(7)
    rest = [tuple(t.clone() for t in b) for b in loader]
    assert len(rest) == 3 and all(torch.equal(a[1], b[1]) for a, b in zip(rest, full[7:], strict=True))
    assert len(_epoch(loader, 2)) == len(full)
