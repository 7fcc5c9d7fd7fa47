"""Issue 30 (ctr small stacked >= 3x): reads in flight (``data.prefetch_readers``) hide a read's round trip once
the step is shorter than one read, and the emulated link never gives them extra bandwidth.

Nothing here times a speed: the link's arithmetic is checked on planted clock values, the overlap by counting
reads in flight, and the batches against the in-memory loader's."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.config import DataConfig
from lab.data import InMemoryLoader, NaiveLoader, ShuffledBatchSampler, ThreadPrefetcher, make_loader
from lab.data import storage as S
from lab.data.prefetch import ordered_reads


def _fresh_preset(name: str, latency_ms: float, bandwidth_mb_s: float) -> S.StoragePreset:
    S._LINKS.pop(name, None)  # a link of its own: no transfer left reserved by another test
    return S.StoragePreset(name, latency_ms, bandwidth_mb_s)


def test_one_reader_pays_exactly_the_presets_cost_per_read():
    cost = _fresh_preset("t-one", 5.0, 100.0)
    t = 1000.0
    for nbytes in (540_672, 10, 1_000_000):
        done = S.read_done_s(cost, nbytes, t)
        assert done == pytest.approx(t + cost.read_cost_s(nbytes))
        t = done + 0.001  # the next read starts after this one ended


def test_reads_in_flight_overlap_their_latency_but_queue_their_transfers():
    cost = _fresh_preset("t-two", 5.0, 100.0)  # 540 kB: 5 ms round trip + 5.4 ms transfer
    n = 540_000
    first = S.read_done_s(cost, n, 1000.0)
    second = S.read_done_s(cost, n, 1000.0)  # started at the same instant, on another reader
    assert first == pytest.approx(1000.0 + 0.005 + 0.0054)
    assert second == pytest.approx(first + 0.0054)  # latency hidden, transfer after the first's: no extra bandwidth
    third = S.read_done_s(cost, n, 1000.0 + 0.050)  # the link is long free again: the full cost, no queue
    assert third == pytest.approx(1000.05 + cost.read_cost_s(n))


@settings(max_examples=25, deadline=None)
@given(n_items=st.integers(0, 12), readers=st.integers(1, 5))
def test_ordered_reads_keep_the_items_order_for_any_number_of_readers(n_items, readers):
    def read(i: int) -> int:
        time.sleep(0.001 * ((7 * i) % 3))  # later items finish first sometimes
        return i * i

    assert list(ordered_reads(read, range(n_items), readers)) == [i * i for i in range(n_items)]


def test_reads_really_overlap_and_stopping_early_starts_no_more_than_the_ones_in_flight():
    lock, state = threading.Lock(), {"now": 0, "most": 0, "started": 0}

    def read(i: int) -> int:
        with lock:
            state["now"] += 1
            state["started"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.01)
        with lock:
            state["now"] -= 1
        return i

    it = ordered_reads(read, range(100), 3)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    it.close()
    assert state["most"] == 3  # three reads were in flight at once: the overlap is real, and bounded
    assert state["started"] <= 5 + 3  # what was consumed, plus at most the reads in flight


def test_a_failing_read_raises_at_its_turn_after_the_earlier_batches():
    def read(i: int) -> int:
        if i == 3:
            raise OSError("read 3 failed (planted)")
        return i

    got = []
    with pytest.raises(OSError, match="planted"):
        for x in ordered_reads(read, range(10), 4):
            got.append(x)
    assert got == [0, 1, 2]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_readers_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="data.prefetch_readers"):
        list(ordered_reads(lambda i: i, range(3), bad))


def test_the_thread_prefetcher_with_readers_delivers_the_in_memory_loaders_batches():
    x = torch.arange(200, dtype=torch.float32).reshape(100, 2)
    y = torch.arange(100)
    ref = list(InMemoryLoader((x, y), ShuffledBatchSampler(100, 8, seed=3)))
    loader = make_loader((x, y), DataConfig(loader="thread", storage="local_ssd", prefetch_readers=3), 8, seed=3)
    assert isinstance(loader, ThreadPrefetcher) and isinstance(loader.loader, NaiveLoader)
    assert loader.loader.readers == 3
    got = list(loader)
    assert len(got) == len(ref) and all(torch.equal(a, b) for g, r in zip(got, ref, strict=True)
                                        for a, b in zip(g, r, strict=True))


@pytest.mark.parametrize("cfg, match", [
    (dict(loader="naive", storage="network_fs", prefetch_readers=2), "has no prefetch reader"),
    (dict(loader="dataloader", num_workers=1, prefetch_readers=2), "DataLoader reads in parallel with num_workers"),
    (dict(loader="thread", source="files", prefetch_readers=2), "in-memory batches only"),
    (dict(loader="thread", prefetch_readers=0), "prefetch_readers"),
])
def test_readers_outside_the_thread_prefetcher_are_refused_with_the_way_out(cfg, match):
    with pytest.raises(ValueError, match=match):
        DataConfig(**cfg)
