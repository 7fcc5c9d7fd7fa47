"""Shards, emulated storage, the lab's loaders, stall analysis and the auto-tuner. Loaders share one batch
order: every loader (the DataLoader path too) delivers exactly the in-memory batches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from lab.config import DataConfig, RunConfig
from lab.data import InMemoryLoader, NaiveLoader, ShuffledBatchSampler, ThreadPrefetcher, make_loader
from lab.data.prefetch import DevicePrefetcher, seed_prefetch_as_written
from lab.data.shards import Manifest, ShardError, ShardReader, write_ctr_shards
from lab.data.storage import PRESETS, EmulatedStore, StoragePreset
from lab.data.studies.autotune import Candidate, autotune, data_config_for
from lab.data.studies.stalls import amdahl_step_ms, data_wait_fraction, ideal_replay, prefetch_memory_mb
from lab.train import run
from lab.workloads.ctr import criteo_like_vocab, generate_click_log


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    write_ctr_shards(root, 3000, 3, seed=1, max_vocab=100, chunk_rows=700)
    return root


def test_shards_hold_the_log_exactly(shard_dir):
    m = Manifest.load(shard_dir)
    assert m.rows == 3000 and [s.rows for s in m.shards] == [1000, 1000, 1000] and "cat" in m.schema
    batches = list(ShardReader(shard_dir, 250, storage="none"))
    assert len(batches) == 12
    label = torch.cat([b[2] for b in batches]).numpy()
    ref = generate_click_log(0, 3000, seed=1, vocab=criteo_like_vocab(100, 26))
    assert np.array_equal(label, ref["label"])
    assert torch.equal(torch.cat([b[1] for b in batches]), torch.from_numpy(ref["cat"]))


def test_corrupted_and_missing_shards_are_named(shard_dir, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(shard_dir, bad)
    raw = bytearray((bad / "shard-00001.parquet").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (bad / "shard-00001.parquet").write_bytes(bytes(raw))
    with pytest.raises(ShardError, match="shard-00001.parquet is corrupted"):
        list(ShardReader(bad, 100, storage="none"))
    (bad / "shard-00002.parquet").unlink()
    with pytest.raises(ShardError, match="shard-00002.parquet is missing"):
        list(ShardReader(bad, 100, storage="none", shard_ids=[2]))


def test_store_returns_the_real_bytes_and_counts_them(shard_dir):
    store = EmulatedStore(shard_dir, StoragePreset("test", latency_ms=1.0, bandwidth_mb_s=1000.0))
    assert store.read_bytes("manifest.json") == (shard_dir / "manifest.json").read_bytes()
    assert store.reads == 1 and store.bytes_read > 0
    assert PRESETS["network_fs"].read_cost_s(2_000_000) == pytest.approx(0.005 + 0.02)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(latency_ms=-1.0, bandwidth_mb_s=1.0), "latency_ms=-1.0"),
    (dict(latency_ms=0.0, bandwidth_mb_s=0.0), "bandwidth_mb_s=0.0"),
])
def test_bad_storage_values_are_named(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        StoragePreset("x", **kwargs)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(loader="naive", storage="tape"), "data.storage='tape'"),
    (dict(loader="thread", prefetch_depth=0), "data.prefetch_depth=0"),
    (dict(loader="thread", num_workers=2), "data.num_workers=2"),
    (dict(loader="dataloader", num_workers=-1), "data.num_workers=-1"),
    (dict(loader="dataloader", prefetch_factor=0, num_workers=1), "data.prefetch_factor=0"),
    (dict(loader="memory", storage="network_fs"), "data.storage='network_fs'"),
])
def test_bad_data_config_values_are_named(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        DataConfig(**kwargs)


def test_data_config_round_trips():
    cfg = RunConfig(data=DataConfig(loader="thread", storage="network_fs", prefetch_depth=4))
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def _tensors(n=96):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, generator=g), torch.arange(n)


def _batches(loader, epoch=1):
    loader.set_epoch(epoch)
    return [b[1].tolist() for b in loader]


@pytest.mark.parametrize("cfg", [DataConfig(loader="naive", storage="local_ssd"),
                                 DataConfig(loader="thread", prefetch_depth=1),
                                 DataConfig(loader="thread", prefetch_depth=3, storage="local_ssd"),
                                 DataConfig(loader="device_prefetch"),
                                 DataConfig(loader="dataloader", num_workers=1, storage="local_ssd")],
                         ids=lambda c: f"{c.loader}-{c.storage}-{c.prefetch_depth}")
def test_every_loader_gives_the_memory_loaders_batches_in_order(cfg):
    t = _tensors()
    ref = _batches(make_loader(t, DataConfig(), 16, seed=5))
    assert _batches(make_loader(t, cfg, 16, seed=5)) == ref


# ------------------------------------------------------- one batch order (the sampler, every loader)
def _arange_tensors(n=103):
    return torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n)


def _epoch(loader, epoch):
    loader.set_epoch(epoch)
    return [tuple(t.clone() for t in b) for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_matches_memory_loader(workers):
    tensors = _arange_tensors()
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
    ref = _epoch(make_loader(_arange_tensors(), DataConfig(), 10, seed=3), 1)
    got = _epoch(make_loader(_arange_tensors(), DataConfig(loader=loader), 10, seed=3), 1)
    assert len(got) == len(ref)
    assert all(torch.equal(a, b) for x, y in zip(got, ref, strict=True) for a, b in zip(x, y, strict=True))


@pytest.mark.parametrize("cfg", [DataConfig(), DataConfig(loader="naive"), DataConfig(loader="thread"),
                                 DataConfig(loader="device_prefetch"), DataConfig(loader="dataloader", num_workers=1)],
                         ids=["memory", "naive", "thread", "device_prefetch", "dataloader1"])
def test_skip_starts_the_epoch_mid_way_once(cfg):
    """What a resume relies on: ``skip(k)`` then a pass yields the epoch's batches from k on, then no more skip."""
    loader = make_loader(_arange_tensors(), cfg, 10, seed=3)
    full = _epoch(loader, 2)
    loader.set_epoch(2)
    loader.skip(7)
    rest = [tuple(t.clone() for t in b) for b in loader]
    assert len(rest) == 3 and all(torch.equal(a[1], b[1]) for a, b in zip(rest, full[7:], strict=True))
    assert len(_epoch(loader, 2)) == len(full)


def test_thread_prefetcher_stops_early_and_reraises_reader_errors():
    t = _tensors()
    pf = ThreadPrefetcher(NaiveLoader(t, ShuffledBatchSampler(96, 8)), depth=2)
    it = iter(pf)
    next(it)
    it.close()  # a consumer stopping at max_steps must not leave the thread blocked on a full queue
    assert pf.max_queued <= 2

    class Broken:
        def __iter__(self):
            yield (torch.zeros(1),)
            raise OSError("shard-00007 read failed")

        def __len__(self):
            return 2

    with pytest.raises(OSError, match="shard-00007"):
        list(ThreadPrefetcher(Broken(), depth=1))
    with pytest.raises(ValueError, match="prefetch_depth=0"):
        ThreadPrefetcher(Broken(), depth=0)


def test_the_seeds_prefetcher_drops_batches_and_returns_its_buffer():
    t = _tensors()
    loader = InMemoryLoader(t, ShuffledBatchSampler(96, 8))
    out = seed_prefetch_as_written(loader, 2)
    assert isinstance(out, list) and len(out) == 2 < len(loader)  # 12 batches read, 10 of them lost
    assert [b[1].tolist() for b in out] == _batches(loader, epoch=0)[-2:]


def test_device_prefetcher_is_a_pass_through_on_cpu():
    t = _tensors()
    loader = InMemoryLoader(t, ShuffledBatchSampler(96, 8, seed=2))
    assert _batches(DevicePrefetcher(loader, "cpu")) == _batches(loader)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_prefetcher_delivers_the_same_batches_on_cuda():
    t = _tensors()
    loader = InMemoryLoader(t, ShuffledBatchSampler(96, 8, seed=2))
    got = [b for b in DevicePrefetcher(loader, "cuda")]
    assert all(b[0].is_cuda for b in got)
    assert [b[1].cpu().tolist() for b in got] == _batches(loader, epoch=0)


def test_thread_loader_run_matches_memory_run_and_records_the_wait(toy_workload):
    base = RunConfig(workload="toy", size="tiny", threads=1, max_steps=6, latency_repeats=0, epochs=1)
    ref = run(base)
    slow = run(dataclasses.replace(base, data=DataConfig(loader="naive", storage="network_fs")))
    pf = run(dataclasses.replace(base, data=DataConfig(loader="thread", storage="network_fs")))
    assert slow.status == pf.status == "ok"
    assert slow.metric == pytest.approx(ref.metric) and pf.metric == pytest.approx(ref.metric)
    assert 0.0 <= data_wait_fraction(slow.step_times_ms) <= 1.0


def test_stall_arithmetic():
    times = {"data_wait": [9.0, 3.0, 3.0], "forward": [1.0, 4.0, 4.0], "backward": [0.0, 2.0, 2.0],
             "optimizer": [0.0, 1.0, 1.0]}
    assert data_wait_fraction(times) == pytest.approx(0.3)
    assert amdahl_step_ms(10.0, 40.0, 2) == 20.0 and amdahl_step_ms(10.0, 4.0, 1) == 10.0
    assert prefetch_memory_mb(1_000_000, 4, num_workers=2) == 8.0


def test_autotune_picks_the_cheapest_near_best_under_the_cap():
    def measure(c: Candidate) -> float:  # saturates at depth 2, workers help up to 2
        return 1000.0 * min(c.depth, 2) * min(c.num_workers + 1, 2)

    out = autotune(measure, 1_000_000, memory_cap_mb=150.0, workers=(0, 1, 2), depths=(1, 2, 4))
    assert out["pick"] == Candidate(1, 2) and "within" in out["reason"]
    assert all(r["throughput"] is None for r in out["rows"] if r["memory_mb"] > 150)
    with pytest.raises(ValueError, match="memory_cap_mb=0.5"):
        autotune(measure, 1_000_000, memory_cap_mb=0.5, workers=(0,), depths=(1,))
    assert data_config_for(Candidate(0, 3), "network_fs").loader == "thread"
    assert data_config_for(Candidate(2, 3), "network_fs").num_workers == 2


def test_ideal_replay_trains_on_cached_batches_with_no_storage_cost(monkeypatch):
    # The replay reads each batch from storage once (untimed), then trains from the cache: count the storage
    # payments instead of asserting on timings.
    import lab.data.prefetch as prefetch

    paid = []
    monkeypatch.setattr(prefetch, "pay", lambda cost, nbytes, started_s: paid.append(nbytes))
    cfg = RunConfig(workload="ctr", size="tiny", threads=1, data=DataConfig(loader="naive", storage="object_store"))
    ideal = ideal_replay(cfg, 5)
    assert len(paid) == 5 and ideal["ideal_step_ms"] > 0
    with pytest.raises(ValueError, match="steps=1"):
        ideal_replay(cfg, 1)
