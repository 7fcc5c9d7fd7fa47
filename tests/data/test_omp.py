"""The reader thread's OpenMP limit: it must hold in that thread, survive that thread's torch ops, and leave
the training thread's count alone (``torch.set_num_threads`` is no substitute: it also sets MKL's
process-wide count)."""

from __future__ import annotations

import threading

import pytest
import torch

from lab.data import NaiveLoader, ShuffledBatchSampler, ThreadPrefetcher, omp

OPENMP = "OpenMP" in torch.__config__.parallel_info()


def _in_thread(fn):  # noqa: ANN001, ANN202
    out = {}

    def run() -> None:
        out["before"] = torch.get_num_threads()
        out["result"] = fn()
        out["after"] = torch.get_num_threads()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out


@pytest.mark.skipif(not OPENMP, reason="ATen's parallel backend here is not OpenMP")
def test_limit_holds_in_its_thread_and_nowhere_else() -> None:
    main_before = torch.get_num_threads()
    # always called: ATen then re-applies this count lazily in each new thread's first torch call, which is
    # the trap that once undid the limit in every run after a process's first
    torch.set_num_threads(max(2, main_before))
    try:
        main = torch.get_num_threads()
        out = _in_thread(lambda: omp.limit_this_thread(1))
        assert out["result"] is True
        assert out["after"] == 1, "the calling thread still runs torch ops on more than one thread"
        assert torch.get_num_threads() == main, "the limit leaked into the main thread"
        # and it still holds after the thread's torch ops (ATen's lazy per-thread init must not undo it)
        ran = _in_thread(lambda: (omp.limit_this_thread(1), torch.ones(4096).cumsum(0))[0])
        assert ran["result"] is True and ran["after"] == 1
    finally:
        torch.set_num_threads(main_before)


@pytest.mark.skipif(not OPENMP, reason="ATen's parallel backend here is not OpenMP")
def test_prefetch_reader_runs_single_threaded_and_yields_the_same_batches() -> None:
    before = torch.get_num_threads()
    tensors = (torch.arange(96.0).reshape(48, 2), torch.arange(48))
    reference = list(NaiveLoader(tensors, ShuffledBatchSampler(48, 8, seed=3)))
    pf = ThreadPrefetcher(NaiveLoader(tensors, ShuffledBatchSampler(48, 8, seed=3)), depth=2)
    assert pf.reader_single_threaded is None  # not started yet
    got = list(pf)
    assert pf.reader_single_threaded is True
    assert torch.get_num_threads() == before
    assert len(got) == len(reference)
    for a, b in zip(got, reference, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_without_openmp_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(omp, "_openmp", lambda: None)
    before = torch.get_num_threads()
    assert _in_thread(lambda: omp.limit_this_thread(1))["result"] is False
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_bad_thread_count_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="integer >= 1"):
        omp.limit_this_thread(bad)  # type: ignore[arg-type]
