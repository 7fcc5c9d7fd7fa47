"""The file-backed source: shards round-trip to the in-memory split, the manifest is reused and invalidated,
corruption is one clear error, bytes are counted, and every loader sees every sample once per epoch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_workload import MapStyleDataset

import lab
from lab.config import DataConfig, RunConfig
from lab.context import prepare
from lab.data import data_bound_why
from lab.data.decode import Augment, decode_png, to_model_input
from lab.data.fileloaders import FileBatchDataset, ReadStats, make_file_loader
from lab.data.files import open_files, to_uint8, write_files
from lab.data.shards import ShardError


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))


def _epoch(loader, epoch=0):
    loader.set_epoch(epoch)
    return [tuple(t.clone() for t in b) for b in loader]


def _ids(n=300):
    return torch.arange(n, dtype=torch.float32).repeat(3, 1).T.contiguous(), torch.arange(n)


@pytest.mark.parametrize("workload", ["ctr", "sequence"])
def test_parquet_round_trip_is_bit_exact(workload, tmp_path):
    with prepare(RunConfig(workload=workload, size="tiny", device="cpu")) as ctx:
        files = write_files(ctx.data.train, ctx.data.info, workload=workload, root=tmp_path / "f")
        assert files.kind == "parquet" and len(files.shard_rows) >= 1
        cfg = DataConfig(loader="naive", shuffle=False, drop_last=False)
        got = _epoch(make_file_loader(files, cfg, 500))
        for k, ref in enumerate(ctx.data.train):
            col = torch.cat([b[k] for b in got])
            assert col.dtype == ref.dtype and torch.equal(col, ref)


def test_vision_decode_equals_the_uint8_source(tmp_path):
    with prepare(RunConfig(workload="vision", size="tiny", device="cpu")) as ctx:
        x, y = ctx.data.train
        info = ctx.data.info
        files = write_files(ctx.data.train, info, workload="vision", root=tmp_path / "f", rows_per_shard=100)
        assert files.kind == "tar" and files.shard_rows == [100] * (len(y) // 100)
        u8 = to_uint8(x, info["normalise_mean"], info["normalise_std"])
        store = files.store("none")
        rows = files.read(store, 3)
        for j, (png, label) in enumerate(rows):
            assert np.array_equal(decode_png(png), u8[300 + j]) and label == int(y[300 + j])
        # un-augmented batches are the uint8 source normalised; and within a quantisation step of the split
        loader = make_file_loader(files, DataConfig(loader="naive", shuffle=False, drop_last=False), 250)
        xs, ys = (torch.cat(c) for c in zip(*_epoch(loader), strict=True))
        assert torch.equal(ys, y)
        assert torch.equal(xs, to_model_input(list(u8), info["normalise_mean"], info["normalise_std"]))
        assert float((xs - x).abs().max()) <= 0.5 / 255 / info["normalise_std"] + 1e-5


@settings(max_examples=20, deadline=None)
@given(pad=st.integers(0, 3), dy=st.integers(0, 6), dx=st.integers(0, 6), flip=st.booleans())
def test_augment_matches_padded_tensor_slicing(pad, dy, dx, flip):
    dy, dx = min(dy, 2 * pad), min(dx, 2 * pad)
    img = np.random.default_rng(0).integers(0, 256, (9, 7), dtype=np.uint8)
    got = Augment(pad=pad, flip_p=1.0).apply(img, np.array([dy, dx]), flip)
    ref = torch.nn.functional.pad(torch.from_numpy(img), (pad, pad, pad, pad))[dy:dy + 9, dx:dx + 7]
    ref = ref.flip(-1) if flip else ref
    assert np.array_equal(got, ref.numpy())


def test_augment_draws_are_per_epoch_and_reproducible():
    a = Augment(pad=2, flip_p=0.5)
    o0, f0 = a.draws(50, seed=1, epoch=0)
    o0b, f0b = a.draws(50, seed=1, epoch=0)
    o1, _ = a.draws(50, seed=1, epoch=1)
    assert np.array_equal(o0, o0b) and np.array_equal(f0, f0b) and not np.array_equal(o0, o1)
    assert o0.min() >= 0 and o0.max() <= 4 and 0 < f0.sum() < 50
    with pytest.raises(ValueError, match="flip_p"):
        Augment(flip_p=2.0)


def test_manifest_is_reused_and_invalidated(tmp_path):
    tensors = _ids()
    a = write_files(tensors, {}, workload="ids", root=tmp_path)
    stamp = (a.root / "manifest.json").stat().st_mtime_ns
    b = write_files(tensors, {}, workload="ids", root=tmp_path)
    assert b.root == a.root and (b.root / "manifest.json").stat().st_mtime_ns == stamp  # not rewritten
    changed = (tensors[0], tensors[1].flip(0))
    assert write_files(changed, {}, workload="ids", root=tmp_path).root != a.root  # other data
    assert write_files(tensors, {}, workload="ids", root=tmp_path, rows_per_shard=50).root != a.root  # settings
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_a_corrupted_shard_is_one_clear_error(tmp_path):
    files = write_files(_ids(), {}, workload="ids", root=tmp_path, rows_per_shard=100)
    shard = files.root / files.manifest.shards[1].name
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))
    loader = make_file_loader(open_files(files.root), DataConfig(loader="naive", shuffle=False), 100)
    with pytest.raises(ShardError, match=r"shard-00001.parquet is corrupted: its SHA-256 does not match"):
        _epoch(loader)
    shard.write_bytes(bytes(data[:-10]))
    with pytest.raises(ShardError, match="truncated or replaced"):
        open_files(files.root)


def test_bytes_and_files_read_are_counted(tmp_path):
    files = write_files(_ids(), {}, workload="ids", root=tmp_path, rows_per_shard=64)
    stats = ReadStats()
    loader = make_file_loader(files, DataConfig(loader="naive", drop_last=False), 32, seed=2, stats=stats)
    _epoch(loader)
    # the epoch reads shard by shard: every shard once, and the bytes are the files' bytes
    assert stats.files_read == len(files.shard_rows) == 5
    assert stats.bytes_read == files.nbytes == sum(s.nbytes for s in files.manifest.shards)
    assert stats.batches == len(loader) and stats.decode_s >= 0


@pytest.mark.parametrize("cfg", [DataConfig(loader="naive"), DataConfig(loader="thread", prefetch_depth=3),
                                 DataConfig(loader="device_prefetch"),
                                 DataConfig(loader="dataloader", num_workers=2, persistent_workers=True)],
                         ids=["naive", "thread", "device_prefetch", "dataloader2"])
def test_every_loader_sees_every_sample_once_per_epoch(cfg, tmp_path):
    files = write_files(_ids(), {}, workload="ids", root=tmp_path, rows_per_shard=64)
    ref = make_file_loader(files, DataConfig(loader="naive", drop_last=False), 20, seed=5)
    loader = make_file_loader(files, DataConfig(**{**cfg.__dict__, "drop_last": False}), 20, seed=5)
    for epoch in (0, 1):
        got, want = _epoch(loader, epoch), _epoch(ref, epoch)
        ids = torch.cat([b[1] for b in got])
        assert sorted(ids.tolist()) == list(range(300))
        assert torch.equal(ids, torch.cat([b[1] for b in want]))  # the same order as the naive loader
        assert torch.equal(torch.cat([b[0] for b in got])[:, 0].long(), ids)  # rows stay whole
    assert not torch.equal(torch.cat([b[1] for b in _epoch(loader, 0)]), torch.cat([b[1] for b in _epoch(loader, 1)]))


def test_skip_resumes_the_epoch_where_it_stopped(tmp_path):
    files = write_files(_ids(), {}, workload="ids", root=tmp_path, rows_per_shard=64)
    loader = make_file_loader(files, DataConfig(loader="thread"), 20, seed=5)
    full = _epoch(loader, 3)
    loader.set_epoch(3)
    loader.skip(4)
    rest = [b for b in loader]
    assert len(rest) == len(full) - 4 and all(torch.equal(a[1], b[1]) for a, b in zip(rest, full[4:], strict=True))
    assert len(_epoch(loader, 3)) == len(full)  # the skip applied once


def test_worker_processes_report_their_reads(tmp_path):
    files = write_files(_ids(), {}, workload="ids", root=tmp_path, rows_per_shard=64)
    stats = ReadStats()
    _epoch(make_file_loader(files, DataConfig(loader="dataloader", num_workers=2), 30, stats=stats))
    assert set(stats.cpu_s_by_worker) == {0, 1} and stats.files_read >= len(files.shard_rows)
    assert FileBatchDataset(files).__getstate__()["_store"] is None


def test_files_source_needs_a_reading_loader():
    with pytest.raises(ValueError, match=r"data.source='files' is invalid: needs a loader that reads files"):
        DataConfig(source="files")


def test_a_run_from_files_records_reads_decode_and_the_ideal_bound():
    cfg = RunConfig(workload="vision", size="tiny", device="cpu", max_steps=6, warmup_steps=1, latency_repeats=0,
                    threads=1, data=DataConfig(source="files", loader="naive", storage="local_ssd", ideal_replay=True))
    result = lab.run(cfg)
    data = result.details["data"]
    assert result.status == "ok" and data["source"] == "files" and data["format"] == "tar"
    assert data["files_read"] >= 1 and data["bytes_read"] >= data["files_read"] * 1000
    assert data["decode_ms_per_batch"] > 0 and data["read_ms_per_batch"] > 0
    assert 0 < data["ideal_step_ms"] <= data["median_step_ms"]
    # with a replay, the share is measured: the run's step against the replayed one
    assert data["data_bound_share"] == pytest.approx(max(0.0, 1 - data["replay_step_ms"] / data["median_step_ms"]))
    assert result.summary()["ideal_step_ms"] == data["ideal_step_ms"]
    assert data["replay_step_ms"] > 0  # the replay ran the same step (same optimizer, precision, compile)
    train, replay = result.details["steps"]["train"], result.details["steps"]["ideal_replay"]
    assert {**train, "loader": None} == {**replay, "loader": None} and replay["loader"] == "CachedLoader"


def test_data_bound_tag_above_the_threshold():
    assert data_bound_why(0.05, 9.5, 10.0) is None
    assert data_bound_why(0.4, 6.0, 10.0).startswith("data-bound: 40% of the step waits for data")
    assert "replay of cached batches" in data_bound_why(0.02, 9.8, 10.0, replay_ms=7.0)
    assert data_bound_why(None, None, None) is None
    # the remedy follows the loader that waited: workers over in-memory rows wait on their own hand-over
    assert "more workers would not" in data_bound_why(0.19, 7.7, 9.3, workers=2, in_memory=True)
    assert "more workers would help" in data_bound_why(0.19, 7.7, 9.3, workers=2)  # reading files: they might
    assert "loader workers would help" in data_bound_why(0.19, 7.7, 9.3)


def test_a_user_map_style_dataset_trains_from_files():
    from lab.workloads import Datasets, SizeSpec, Workload, register_workload
    from lab.workloads.base import _REGISTRY

    spec = SizeSpec(n_train=256, n_test=64, batch_size=32, epochs=1, lr=0.01)
    register_workload(Workload(
        name="mapstyle", description="map-style Dataset for tests", sizes=spec,
        make_data=lambda s, seed: Datasets(train=MapStyleDataset(256, 6, seed), test=MapStyleDataset(64, 6, seed + 1)),
        make_model=lambda s: torch.nn.Linear(6, 2), loss=torch.nn.functional.cross_entropy,
        evaluate=lambda out, y: {"accuracy": (out.argmax(1) == y).float().mean().item()}, metric_name="accuracy"),
        overwrite=True)
    cfg = RunConfig(workload="mapstyle", size="tiny", device="cpu", latency_repeats=0, warmup_steps=1,
                    data=DataConfig(source="files", loader="dataloader", num_workers=1))
    try:
        result = lab.run(cfg)
    finally:
        _REGISTRY.pop("mapstyle", None)  # other tests list the registered workloads
    data = result.details["data"]
    assert result.status == "ok" and data["format"] == "parquet" and data["files_read"] >= 1
    assert data["batches"] == result.steps == 8 and "0" in data["loader_cpu_s_by_worker"]
