"""Pieces the lab writes once and every user shares (issue 26 item 7): the loader-wrapper base, the
model-size ladder, the classification workload, and the ideal-loader replay."""

from __future__ import annotations

import pytest
import torch

from lab import RunConfig, prepare
from lab.config import DataConfig
from lab.data import make_loader
from lab.data.prefetch import DevicePrefetcher, ThreadPrefetcher
from lab.data.sampler import FollowsOrder, InMemoryLoader, ShuffledBatchSampler
from lab.data.studies.stalls import CachedLoader, replay_cached
from lab.workloads import SCALE_NAMES, get_workload
from lab.workloads.base import ladder
from lab.workloads.metrics import classification_loss, classification_metrics, classifier


def _tensors(n=50):
    return torch.arange(n * 2, dtype=torch.float32).reshape(n, 2), torch.arange(n)


@pytest.mark.parametrize("loader", ["memory", "naive", "thread", "device_prefetch", "dataloader"])
def test_every_loader_takes_its_order_from_one_sampler(loader):
    built = make_loader(_tensors(), DataConfig(loader=loader), 10, seed=1)
    assert isinstance(built, FollowsOrder)
    inner = built
    while not isinstance(inner, ShuffledBatchSampler):  # a prefetcher's order is the loader it wraps
        inner = inner.order
    built.set_epoch(3)
    built.skip(2)
    assert (inner.epoch, inner._skip) == (3, 2) and len(built) == len(inner) == 5


def test_a_wrapper_forwards_epoch_skip_and_length_to_what_it_wraps():
    sampler = ShuffledBatchSampler(50, 10, seed=1)
    wrapped = DevicePrefetcher(ThreadPrefetcher(InMemoryLoader(_tensors(), sampler)), "cpu")
    wrapped.set_epoch(4)
    wrapped.skip(3)
    assert len(wrapped) == 5 and sampler.epoch == 4
    assert len(list(wrapped)) == 2 and len(list(wrapped)) == 5  # the skip holds for one pass


def test_the_ladder_names_five_rungs_and_only_the_largest_is_speed_only():
    rungs = ladder(xs={"w": 1}, s={"w": 2}, m={"w": 3}, l={"w": 4}, xl={"w": 5})
    assert list(rungs) == list(SCALE_NAMES)
    assert [r.speed_only for r in rungs.values()] == [False, False, False, False, True]
    assert rungs["m"].model == {"w": 3}
    with pytest.raises(ValueError, match="unknown model-scale rung"):
        ladder(xxl={"w": 6})


@pytest.mark.parametrize("name", ["ctr", "mlp", "sequence", "transformer", "vision"])
def test_every_built_in_ladder_tops_out_with_one_speed_only_rung(name):
    scales = get_workload(name).scales
    assert [r for r, rung in scales.items() if rung.speed_only] == ["xl"]


def test_a_classifier_is_scored_by_accuracy_under_cross_entropy():
    base = get_workload("mlp")
    wl = classifier(name="mine", description="d", sizes=base.sizes, make_data=base.make_data,
                    make_model=base.make_model)
    assert (wl.metric_name, wl.loss, wl.evaluate, wl.higher_is_better) == (
        "accuracy", classification_loss, classification_metrics, True)
    for name in ("mlp", "sequence", "transformer", "vision"):
        assert get_workload(name).evaluate is classification_metrics


def test_the_replay_trains_on_the_batches_it_read_and_builds_no_model_when_too_few(toy_workload):
    cfg = RunConfig(workload="toy", size="tiny", threads=1, latency_repeats=0)
    built = []
    with prepare(cfg) as ctx:

        def prepared():
            built.append(True)
            return ctx.new_model(), []

        steps = len(ctx.make_loader())
        assert replay_cached(ctx, steps + 5, prepared, fewest=steps + 1) is None and not built
        stats = replay_cached(ctx, 3, prepared, phase="replay_test")
    assert built == [True] and stats.steps == 3
    assert ctx.result.details["steps"]["replay_test"]["loader"] == CachedLoader.__name__
