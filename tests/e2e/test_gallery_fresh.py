"""The doctor's held-out ``fresh`` models (tests/gallery_fresh.py) are real workloads: each builds, trains a few
steps through ``lab.run`` by name with a finite loss and is evaluated, and each carries the pattern it is in the
set for, so a doctor score on them is a score on working models of those patterns. Cheap by design (a few steps
each; the set's learning was checked when it was built, 48 tiny steps each). No timing assertions."""

from __future__ import annotations

import math

import pytest
import torch
from gallery_fresh import FRESH, KeywordSpotter, NextItem, register_fresh

from lab import RunConfig, run


@pytest.fixture(scope="module", autouse=True)
def fresh_workloads():
    return register_fresh()


def test_the_set_has_seven_models_none_shared_with_the_other_sets() -> None:
    from gallery import GALLERY
    from gallery_pasted import PASTED
    from gallery_unseen import UNSEEN

    assert len(FRESH) == 7 and all(n.startswith("fresh_") for n in FRESH)
    models = {type(w.make_model(w.size("tiny"))).__name__ for w in FRESH.values()}
    others = {type(w.make_model(w.size("tiny"))).__name__ for s in (GALLERY, UNSEEN, PASTED) for w in s.values()}
    assert len(models) == 7 and not models & others, models & others


@pytest.mark.parametrize("name", sorted(FRESH))
def test_fresh_model_trains_a_few_steps_through_the_lab(name: str) -> None:
    r = run(RunConfig(workload=name, size="tiny", threads=1, max_steps=2, warmup_steps=1, latency_repeats=0))
    assert r.status == "ok" and r.error is None, (name, r.error)
    assert r.workload == name and r.param_count > 0 and r.steps == 2
    assert len(r.losses) == 2 and all(math.isfinite(x) for x in r.losses), r.losses
    assert r.metric_name == "accuracy" and r.metric is not None and 0.0 <= r.metric <= 1.0


def test_the_data_are_generated_not_downloaded_and_repeat() -> None:
    wl = FRESH["fresh_tabular"]
    a, b = wl.make_data(wl.size("tiny"), 0), wl.make_data(wl.size("tiny"), 0)
    assert torch.equal(a.train[0], b.train[0]) and torch.equal(a.train[1], b.train[1])


def test_the_patterns_are_there() -> None:
    """What each model is in the set for, checked on the module: a transposed-view buffer, a tied table."""
    kws = KeywordSpotter()
    assert not kws.basis.is_contiguous()
    tower = NextItem().model
    assert tower.history.weight is tower.item_emb.weight
